"""The CPU presets keep their promises (minutes each; `make test-slow`)."""

import time

import pytest

from analyses.cli import main
from models.runs import read_metrics

pytestmark = pytest.mark.slow


def test_the_demo_learns_the_seen_pairs_and_writes_every_report_section_within_ten_minutes(tmp_path):
    started = time.perf_counter()
    assert main(["demo", "--out", str(tmp_path / "demo"), "--no-progress"]) == 0
    assert time.perf_counter() - started < 600
    assert read_metrics(tmp_path / "demo")[-1]["acc_seen"] >= 0.9
    report = (tmp_path / "demo/report.html").read_text()
    for section in ("Verdict", "Circuit", "Timeline: the solution through training", "Training curves",
                    "Attention patterns", "Configuration"):
        assert f">{section}" in report, section


def test_composite_cpu_learns_the_seen_pairs_within_ten_minutes(tmp_path):
    started = time.perf_counter()
    assert main(["train", "--preset", "composite-cpu", "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    assert time.perf_counter() - started < 600
    assert read_metrics(tmp_path / "c")[-1]["acc_seen"] >= 0.9


def test_benchmark_prints_every_number(capsys):
    assert main(["benchmark", "--quick"]) == 0
    out = capsys.readouterr().out
    for phrase in ["sentences/s", "tokens/s", "of the float32 matmul peak", "flush-to-zero"]:
        assert phrase in out
