"""Every `workbench` command once, at the smallest size it takes: the quick tier's check that no
command is broken (`make test-quick`). What each command writes is tested in depth in
tests/integration/; here each must exit 0 and leave its main file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyses.cli import main
from analyses.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "train.steps=8", "--set", "train.eval_every=4", "--set", "train.eval_size=32",
        "--set", "train.batch_size=16", "--set", "train.checkpoint_every=8", "--set", "model.d_model=32",
        "--set", "model.d_head=16", "--set", "model.d_mlp=64", "--set", "train.snapshots=0", "--no-progress"]
SMOKED = {"train", "demo", "curriculum", "analyze", "analyze-model", "report", "study", "sweep", "presets", "zoo",
          "benchmark", "circuit-export", "circuit-compare"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke") / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *TINY]) == 0
    return out


def test_every_command_is_smoked_here():
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert commands == SMOKED, "a new command: add its smoke test below"


def test_train_report_analyze_and_the_circuit_commands(run, tmp_path):
    assert (run / "model.safetensors").exists()
    assert main(["report", str(run)]) == 0 and (run / "report.html").exists()
    assert main(["analyze", str(run), "--no-progress"]) == 0 and json.loads((run / "analysis.json").read_text())
    assert main(["circuit-export", str(run), "--out", str(tmp_path / "mib"), "--no-edges"]) == 0
    assert (tmp_path / "mib" / "circuit.json").exists()
    assert main(["circuit-compare", str(run), str(tmp_path / "mib"), "--no-edges",
                 "--out", str(tmp_path / "compare.json")]) == 0
    assert (tmp_path / "compare.json").exists()


def test_sweep_and_study_at_their_smallest(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "composite-cpu", *TINY, "--grid", "train.seed=0,1", "--workers", "1",
                 "--out", str(out)]) == 0
    assert (out / "sweep.json").exists()
    assert main(["study", "composite-lr-wd", "--scale", "tiny", "--out", str(tmp_path / "study"), "--workers", "1",
                 "--no-progress"]) == 0


def test_demo_and_curriculum_take_settings(tmp_path):
    demo = tmp_path / "demo"
    assert main(["demo", "--out", str(demo), "--set", "train.steps=4", "--set", "train.eval_size=32",
                 "--set", "train.snapshots=2", "--set", "model.d_model=32", "--set", "model.d_mlp=64",
                 "--no-learned", "--no-progress"]) == 0
    assert (demo / "report.html").exists()
    assert main(["curriculum", "--list"]) == 0


def test_the_listing_commands_and_analyze_model(tmp_path, capsys, monkeypatch):
    assert main(["presets"]) == 0 and "composite-code" in capsys.readouterr().out
    assert main(["zoo", "list"]) == 0 and "composite-matched-inferential" in capsys.readouterr().out
    assert main(["benchmark", "--quick"]) == 0
    monkeypatch.chdir(ROOT)
    assert main(["analyze-model", "--model", "analyses/examples/induction.py:build", "--prompts",
                 "analyses/examples/induction_pairs.json", "--out", str(tmp_path / "induction")]) == 0
    assert (tmp_path / "induction" / "report.html").exists()
