"""The AtP* yardstick's summary over runs: the recovery curve per verification budget."""

import sys

import pytest

import analyses.research.atp_yardstick as atp_yardstick
from analyses.research.atp_yardstick import curve_table, recovery_curve


def test_the_recovery_curve_is_the_share_of_runs_recovered_within_each_budget():
    fractions = [0.02, 0.1, 0.3125, 0.5, 1.0]  # 0.1 and 0.5 sit exactly on a budget: recovered within it
    assert recovery_curve(fractions, (0.05, 0.1, 0.25, 0.5, 0.75)) == pytest.approx([0.2, 0.4, 0.4, 0.8, 0.8])
    header, row = curve_table({("head", "atp"): fractions}, (0.1, 0.5))
    assert header.split() == ["cells", "estimate", "runs", "10%", "50%"]
    assert row.split() == ["head", "atp", "5", "40%", "80%"]


def test_the_yardstick_prints_the_per_head_curve(monkeypatch, capsys):
    per_run = {"a": {("head", "atp"): (0.25, 0.3, 16), ("head x pos", "atp"): (0.01, 0.6, 512)},
               "b": {("head", "atp"): (0.5625, 0.1, 16), ("head x pos", "atp"): (0.2, 0.4, 512)}}
    monkeypatch.setattr(atp_yardstick, "load_run", lambda run_dir: run_dir)
    monkeypatch.setattr(atp_yardstick, "yardstick", lambda run, *args: per_run[run])
    monkeypatch.setattr(sys, "argv", ["atp_yardstick", "a", "b"])
    atp_yardstick.main()
    out = capsys.readouterr().out
    curve = out[out.index("share of runs whose exact top 3"):].splitlines()
    assert curve[1].split() == ["cells", "estimate", "runs", "5%", "10%", "25%", "50%", "75%"]
    assert curve[2].split() == ["head", "atp", "2", "0%", "0%", "50%", "50%", "100%"]
    assert curve[3].split() == ["head", "x", "pos", "atp", "2", "50%", "50%", "100%", "100%", "100%"]
