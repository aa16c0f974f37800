"""analyses/gpu/composite_paper.sh, run on the CPU with a tiny schedule: it trains each cell into
its own run folder with the paper preset's settings, and a second call resumes instead of
starting again. The scripts' interpreter (their PYTHON) is tests/processes.py's stand-in, which
runs each `python -m analyses.cli ...` forked from the fork server rather than importing torch anew."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.processes import forked_python

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--set train.steps=4 --set train.eval_every=2 --set train.eval_size=64 --set train.n_train=500 "
        "--set train.warmup_steps=1 --set train.batch_size=16 --set train.precision=fp32 --set train.compile=false "
        "--set model.d_model=32 --set model.d_head=16 --set model.d_mlp=64 --set train.checkpoint_every=2")


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> str:
    """The scripts' PYTHON: `python -m analyses.cli` forked from the fork server (tests/processes.py)."""
    with forked_python(tmp_path_factory.mktemp("python")) as stand_in:
        yield str(stand_in)


def _run(out: Path, python: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "CELLS": "0.8:1e-4", "EXTRA": TINY,
           "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", str(ROOT / "analyses/gpu/composite_paper.sh"), str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def paper_cell(tmp_path_factory, python) -> tuple[Path, subprocess.CompletedProcess]:
    """The script's first call, once for the module: its folder and what it printed."""
    out = tmp_path_factory.mktemp("paper")
    return out, _run(out, python)


def test_composite_paper_script_trains_the_paper_preset_and_resumes(paper_cell, python):
    tmp_path, first = paper_cell
    assert first.returncode == 0, first.stderr
    run = tmp_path / "d2-g0.8-lr1e-4"
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["model"]["init_gamma"], cfg["train"]["lr"], cfg["task"]["key_modulus"]) == (0.8, 1e-4, 9)
    assert (cfg["model"]["biases"], cfg["model"]["norm_position"], cfg["model"]["n_layers"]) == (False, "post", 2)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [2, 4]
    assert "'step': 4" in first.stdout
    metrics, weights_written = (run / "metrics.jsonl").read_text(), (run / "model.safetensors").stat().st_mtime_ns
    again = _run(tmp_path, python)  # the finished run is resumed (nothing left to train), not started again
    assert again.returncode == 0, again.stderr
    assert (run / "metrics.jsonl").read_text() == metrics  # a new run would have written new elapsed times
    assert (run / "model.safetensors").stat().st_mtime_ns == weights_written
    assert "error" not in (tmp_path / "d2-g0.8-lr1e-4.log").read_text().lower()  # resumed, not refused


def test_a_resumed_run_that_dies_keeps_its_checkpoint(tmp_path, paper_cell, python):
    """A run with a checkpoint whose resume fails is left in place for the next call, not moved
    aside and trained again from step 0 (which would throw its steps away)."""
    trained, first = paper_cell
    assert first.returncode == 0, first.stderr
    tmp_path = tmp_path / "paper"
    shutil.copytree(trained, tmp_path, symlinks=True)
    run = tmp_path / "d2-g0.8-lr1e-4"
    metrics = (run / "metrics.jsonl").read_text()
    failing = tmp_path / "python-that-cannot-resume"
    failing.write_text(f'#!/bin/bash\nfor a in "$@"; do [ "$a" = --resume ] && exit 1; done\nexec {python} '
                       '"$@"\n')
    failing.chmod(0o755)
    again = _run(tmp_path, str(failing))
    assert "has a checkpoint: left as it is" in again.stdout
    assert (run / "metrics.jsonl").read_text() == metrics
    assert not list(tmp_path.glob("*.failed*"))


def test_lego8_script_trains_each_curriculum_with_eight_layers_and_resumes(tmp_path, python):
    """analyses/gpu/lego8.sh on the CPU with a tiny schedule: BERT and ALBERT-SD curricula side by side,
    each stage with 8 layers, its seed and (ALBERT-SD) stochastic depth; a second call resumes."""
    tiny = ("train.steps=2 train.eval_every=2 train.eval_size=32 train.batch_size=16 train.checkpoint_every=2 "
            "train.compile=false model.d_model=16")
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "EXTRA": tiny, "ANALYZE": "0",
           "PYTHONPATH": str(ROOT), "RUNS": "bert-s1:lego-three-hops:1:- albertsd-s0:lego-three-hops-albert:0:4"}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "analyses/gpu/lego8.sh"), str(tmp_path)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)

    first = run()
    assert first.returncode == 0, first.stderr
    expected = {"bert-s1": (1, False, None), "albertsd-s0": (0, True, 4)}
    for name, (seed, tied, min_depth) in expected.items():
        stages = sorted(p.name for p in (tmp_path / name).iterdir() if p.is_dir())
        assert stages == ["1-one-hop", "2-three-hops-n6", "3-three-hops-n8"]
        for stage in stages:
            cfg = json.loads((tmp_path / name / stage / "config.json").read_text())
            assert (cfg["model"]["n_layers"], cfg["train"]["seed"], cfg["train"]["precision"]) == (8, seed, "fp32")
            assert (cfg["model"]["tie_layers"], cfg["model"]["min_depth"]) == (tied, min_depth)
    last = tmp_path / "bert-s1" / "3-three-hops-n8" / "metrics.jsonl"
    metrics = last.read_text()
    assert run().returncode == 0
    assert last.read_text() == metrics  # finished stages are kept, not trained again


@pytest.mark.slow  # 45 s; the curricula's configs are checked fast in test_curriculum.py
def test_lego12_script_adds_the_papers_n12_stage_with_twelve_layers(tmp_path, python):
    """analyses/gpu/lego12.sh: lego8.sh's stages with 12 layers, then #0-#5 of n = 12 (the paper's
    task) from the third stage's weights; tied layers for ALBERT."""
    tiny = ("train.steps=2 train.eval_every=2 train.eval_size=32 train.batch_size=16 train.checkpoint_every=2 "
            "train.compile=false model.d_model=16")
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "EXTRA": tiny, "ANALYZE": "0",
           "PYTHONPATH": str(ROOT), "RUNS": "albert-s1:lego-n12-albert:1:-"}
    done = subprocess.run(["bash", str(ROOT / "analyses/gpu/lego12.sh"), str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = sorted(p.name for p in (tmp_path / "albert-s1").iterdir() if p.is_dir())
    assert stages == ["1-one-hop", "2-three-hops-n6", "3-three-hops-n8", "4-n12"]
    configs = {stage: json.loads((tmp_path / "albert-s1" / stage / "config.json").read_text()) for stage in stages}
    assert all((c["model"]["n_layers"], c["model"]["tie_layers"], c["train"]["seed"]) == (12, True, 1)
               for c in configs.values())
    last = configs["4-n12"]
    assert (last["task"]["n_vars"], last["task"]["n_letters"], last["task"]["n_supervised"]) == (12, 12, 6)
    assert last["train"]["init_from"].endswith("3-three-hops-n8")


def test_lego8_script_fails_when_a_run_fails(tmp_path, python):
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "ANALYZE": "0", "PYTHONPATH": str(ROOT),
           "RUNS": "typo:lego-three-hopz:0:-"}
    done = subprocess.run(["bash", str(ROOT / "analyses/gpu/lego8.sh"), str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "a run failed" in done.stdout
    assert "lego-three-hopz" in (tmp_path / "typo.log").read_text()


@pytest.mark.slow
def test_timelines_script_trains_every_run_with_snapshots_and_writes_each_timeline(tmp_path, python):
    """analyses/gpu/timelines.sh on the CPU with tiny models (about 5 minutes on 2 cores): every
    run it trains ends with snapshots and a timeline.json (the paper-scale run too, from its last
    checkpoint), the LEGO curricula's first two stages included."""
    extra = ("--set model.d_model=32 --set model.d_head=16 --set model.d_mlp=64 --set train.steps=12 "
             "--set train.eval_every=6 --set train.checkpoint_every=6 --set train.eval_size=400 "
             "--set train.batch_size=16 --set train.n_train=64 --set train.warmup_steps=2 --set train.compile=false")
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "EXTRA": extra, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "analyses/gpu/timelines.sh"), str(tmp_path), "500", "150"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    runs = ["paper-fp32", "shortcut", *[f"matched/init_gamma={g}__seed={s}" for g in (0.5, 0.9) for s in (0, 1)],
            *[f"lego-{kind}/{stage}" for kind in ("bert", "albert") for stage in ("1-one-hop", "2-three-hops-n6")]]
    missing = [run for run in runs if not (tmp_path / run / "timeline.json").is_file()]
    assert not missing, done.stdout
    timeline = json.loads((tmp_path / "matched/init_gamma=0.9__seed=0/timeline.json").read_text())
    assert timeline["points"][0]["step"] == 0 and timeline["task"] == "composite"


@pytest.mark.slow  # six processes that each import torch: minutes on 2 loaded cores
def test_templates_width_script_trains_each_width_and_resumes(tmp_path, python):
    """analyses/gpu/templates_width.sh on the CPU with a tiny schedule: one sweep per width, plain and
    augmented cells of each n and seed at that width, the table printed; a second call trains nothing
    again (every cell is finished)."""
    tiny = "train.steps=4 train.eval_every=2 train.eval_size=64 train.checkpoint_every=2 train.plateau_min_steps=4"
    env = {**os.environ, "PYTHON": python, "DEVICE": "cpu", "WIDTHS": "16 32", "SEEDS": "0", "NS": "4",
           "EXTRA": tiny, "PYTHONPATH": str(ROOT)}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "analyses/gpu/templates_width.sh"), str(tmp_path)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    for width in (16, 32):
        cells = sorted(p.name for p in (tmp_path / f"d{width}").iterdir() if (p / "config.json").exists())
        assert len(cells) == 2 and any("identity_attention=true" in c for c in cells)
        cfg = json.loads((tmp_path / f"d{width}" / cells[0] / "config.json").read_text())
        assert (cfg["model"]["d_model"], cfg["task"]["template"]) == (width, "copy")
        assert cfg["train"]["identity_lr_scale"] == 10
    rows = [json.loads(line) for line in first.stdout.splitlines() if line.startswith('{"')]
    assert {(r["d_model"], r["n"]) for r in rows if "n" in r and "d_model" in r} == {(16, 4), (32, 4)}
    metrics = (tmp_path / "d32" / cells[0] / "metrics.jsonl").read_text()
    assert run().returncode == 0 and (tmp_path / "d32" / cells[0] / "metrics.jsonl").read_text() == metrics


def test_the_scripts_stand_in_interpreter_runs_the_command_line_as_a_fresh_one_would(python, tmp_path):
    """tests/processes.py's `forked_python`: the command's output reaches the caller's stdout and
    stderr, its exit status is the caller's, and anything but `-m analyses.cli` is the real interpreter."""
    listed = subprocess.run([python, "-m", "analyses.cli", "presets"], capture_output=True, text=True, cwd=tmp_path)
    assert listed.returncode == 0 and "composite-cpu" in listed.stdout
    refused = subprocess.run([python, "-m", "analyses.cli", "train", "--preset", "no-such-preset", "--out", "run"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "no-such-preset" in refused.stderr and refused.stdout == ""
    plain = subprocess.run([python, "-c", "import os, sys; print(sys.flags.no_site, os.getcwd())"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert plain.stdout.split() == ["0", str(tmp_path)]
