"""A sweep killed for real (SIGKILL) after its first cells finished, then re-run, trains only
the cells it had not finished; a two-worker sweep killed mid-cell leaves no worker behind."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from analyses.cli import main
from models.runs import WEIGHTS, read_config, run_state
from tests.processes import start_cli

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=16",
         "--set", "train.batch_size=16", "--set", "train.eval_every=8", "--set", "train.eval_size=64",
         "--set", "train.warmup_steps=2", "--set", "train.checkpoint_every=8", "--no-progress"]


def _descendants(pid: int) -> list[int]:
    """The pids of a process's children, grandchildren ..., from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def _running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _finished(out: Path) -> dict[str, int]:
    """Cells that are done, with the modification time of their weights."""
    return {p.name: (p / WEIGHTS).stat().st_mtime_ns for p in sorted(out.iterdir())
            if p.is_dir() and (p / "config.json").exists() and run_state(p, read_config(p)) == "done"}


def test_a_killed_sweep_rerun_trains_only_the_missing_cells(tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0,1,2,3,4,5", "--out", str(out),
            "--workers", "1", *SMALL]
    proc = start_cli(*args, cwd=REPO)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        index = out / "cells.json"
        if index.exists() and len(json.loads(index.read_text())) >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]
    before = _finished(out)
    assert 2 <= len(before) < 6  # killed halfway: some cells finished, some not
    assert not (out / "sweep.json").exists()

    assert main(args) == 0
    after = _finished(out)
    assert len(after) == 6
    assert {name: after[name] for name in before} == before  # finished cells were not trained again
    index = json.loads((out / "sweep.json").read_text())
    assert index["counts"] == {"done": 6}


def test_a_cell_killed_after_its_checkpoint_resumes_from_it_and_diverged_cells_are_not_retrained(tmp_path):
    """Killed while a cell is between its first checkpoint and its end: the re-run resumes that
    cell (its metrics before the checkpoint keep their recorded times) and ends with the weights
    of an uninterrupted run; a diverged cell is left as it is, files untouched."""
    out = tmp_path / "sweep"
    longer = [*SMALL, "--set", "train.steps=160", "--set", "train.eval_every=8", "--set", "train.grad_clip=null",
              "--set", "train.warmup_steps=0"]
    args = ["sweep", "--preset", "composite-cpu", "--grid", "train.lr=1e30,0.001", "--out", str(out), "--workers", "1",
            *longer]
    proc = start_cli(*args, cwd=REPO)
    cell = out / "lr=0.001"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = cell / "metrics.jsonl"
        checkpointed = (cell / "train_state.safetensors").exists()
        if checkpointed and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]
    assert run_state(cell, read_config(cell)) == "partial"
    diverged = out / "lr=1e+30"
    assert run_state(diverged, read_config(diverged)) == "diverged"
    untouched = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in diverged.rglob("*") if p.is_file()}
    first_record = (cell / "metrics.jsonl").read_text().splitlines()[0]

    assert main(args) == 0  # a diverged cell is recorded, not a failure
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in diverged.rglob("*") if p.is_file()} == untouched
    assert (cell / "metrics.jsonl").read_text().splitlines()[0] == first_record  # resumed, not restarted
    assert main(["train", "--preset", "composite-cpu", "--out", str(tmp_path / "whole"), "--set", "train.lr=0.001",
                 *longer]) == 0
    whole, resumed = (load_file(str(d / WEIGHTS)) for d in (tmp_path / "whole", cell))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.slow  # 30-50 s: three sweeps (the fast check of the watch itself: tests/unit/test_lifeline.py)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the parent-death watch is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_a_two_worker_sweep_killed_mid_cell_leaves_no_worker_and_its_rerun_finishes(tmp_path, signum):
    """SIGKILL (an OOM kill, a CI time-out) or SIGHUP (a closed terminal) to the sweep while both
    workers train: within 10 s no process it started is left, and the same command then finishes
    every cell, the killed ones resumed, with the weights of a sweep never killed."""
    out, clean = tmp_path / "sweep", tmp_path / "clean"
    grid = ["--grid", "train.seed=0,1,2", *SMALL, "--set", "train.steps=64"]
    args = ["sweep", "--preset", "composite-cpu", "--out", str(out), "--workers", "2", *grid]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "analyses.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not all(
            len((out / f"seed={s}" / "metrics.jsonl").read_text().splitlines()) >= 2
            if (out / f"seed={s}" / "metrics.jsonl").exists() else False for s in (0, 1)):
        time.sleep(0.02)
    started = _descendants(proc.pid)
    assert len(started) >= 2, "the sweep started no workers"  # forkserver, workers, resource tracker
    proc.send_signal(signum)
    proc.wait()
    assert proc.returncode in (-signum, 128 + signum), proc.stderr.read().decode()[-2000:]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in started):
        time.sleep(0.1)
    left = [pid for pid in started if _running(pid)]
    for pid in left:  # so a failing test leaves no trainer behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of the sweep's {len(started)} processes outlived it by 10 s"
    assert len(_finished(out)) < 3 and not (out / "sweep.json").exists()  # killed mid-way

    assert main(args) == 0  # no cell is refused: the killed workers' locks are free
    assert json.loads((out / "sweep.json").read_text())["counts"] == {"done": 3}
    assert main(["sweep", "--preset", "composite-cpu", "--out", str(clean), "--workers", "1", *grid]) == 0
    for cell in ("seed=0", "seed=1", "seed=2"):
        resumed, whole = (load_file(str(d / cell / WEIGHTS)) for d in (out, clean))
        assert all(torch.equal(whole[k], resumed[k]) for k in whole), cell
