"""The sweep runner on the local backend: run folders and index, skipping finished cells,
recording diverged and crashed cells without stopping the others, retrying failed ones."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from analyses.cli import main
from analyses.runners.cell import CellResult
from analyses.runners.sweep import _run_pool, run_cells
from tests.helpers import tiny_composite_run
from tests.processes import start

TINY = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=12",
        "--set", "train.batch_size=16", "--set", "train.eval_every=6", "--set", "train.eval_size=64",
        "--set", "train.warmup_steps=2", "--set", "train.checkpoint_every=6", "--no-progress"]
DIVERGES = ["train.lr=1e9", "train.grad_clip=null", "model.init_gamma=0.01", "train.weight_decay=0",
            "train.warmup_steps=0"]


def _weights_mtimes(root):
    return {p.parent.name: p.stat().st_mtime_ns for p in root.glob("*/model.safetensors")}


def test_sweep_command_writes_cells_index_and_report_and_skips_finished_cells(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "composite-cpu", "--grid", "model.init_gamma=0.3,0.5", "train.seed=1",
            "--out", str(out), "--workers", "1", *TINY]
    assert main(args) == 0
    index = json.loads((out / "sweep.json").read_text())
    names = ["init_gamma=0.3__seed=1", "init_gamma=0.5__seed=1"]
    assert list(index["cells"]) == names and index["counts"] == {"done": 2}
    assert index["cells"]["init_gamma=0.5__seed=1"]["point"] == {"model.init_gamma": 0.5, "train.seed": 1}
    assert all(json.loads((out / n / "config.json").read_text())["model"]["d_model"] == 32 for n in names)
    assert "acc_seen" in (out / "report.html").read_text()
    first = _weights_mtimes(out)
    assert main(args) == 0  # the same command again trains nothing
    assert _weights_mtimes(out) == first
    assert "sweep of 2 cells" in capsys.readouterr().out


def test_a_diverged_and_a_crashed_cell_do_not_stop_the_others_and_failures_are_retried(tmp_path):
    base = tiny_composite_run(steps=12)
    cells = {"ok": base, "diverges": base.with_overrides(DIVERGES), "crashes": base.with_overrides(["train.seed=1"])}
    (tmp_path / "crashes").mkdir()
    (tmp_path / "crashes" / "train_state.safetensors").write_bytes(b"not a checkpoint")  # resuming it raises
    results = run_cells(cells, tmp_path, progress=False)
    assert {n: r.status for n, r in results.items()} == {"ok": "done", "diverges": "diverged", "crashes": "failed"}
    assert "safetensors" in results["crashes"].error.lower() or "header" in results["crashes"].error.lower()
    assert json.loads((tmp_path / "cells.json").read_text())["diverges"]["status"] == "diverged"

    (tmp_path / "crashes" / "train_state.safetensors").unlink()  # the cause goes away; re-running retries it
    again = run_cells(cells, tmp_path, progress=False)
    assert {n: r.status for n, r in again.items()} == {"ok": "done", "diverges": "diverged", "crashes": "done"}


def dies_on_cell_b(name: str, cfg_dict: dict, run_dir: str) -> CellResult:
    """Stands in for train_cell (no training, so the test's workers start fast)."""
    if name == "b":
        os._exit(9)  # what a segfault or the out-of-memory killer looks like to the pool
    return CellResult(name, "done", {"seed": cfg_dict["train"]["seed"], "pid": os.getpid()})


def test_a_worker_process_that_dies_fails_only_its_own_cell(tmp_path):
    jobs = {name: (tiny_composite_run(seed=i).to_dict(), str(tmp_path / name)) for i, name in enumerate("abcd")}
    recorded = []
    _run_pool(jobs, 2, recorded.append, cell_fn=dies_on_cell_b)
    assert sorted((r.name, r.status) for r in recorded) == [("a", "done"), ("b", "failed"), ("c", "done"),
                                                            ("d", "done")]
    assert "died" in next(r.error for r in recorded if r.name == "b")
    assert {r.final.get("seed") for r in recorded if r.status == "done"} == {0, 2, 3}
    assert all(r.final["pid"] != os.getpid() for r in recorded if r.status == "done")  # trained in workers


def test_a_pool_broken_while_cells_are_still_handed_out_retries_those_not_handed_out(tmp_path, monkeypatch):
    """A worker may die before the last cell is submitted (workers forked from a preloaded server
    start at once): the submit raises, and the cells not yet handed out are retried, not lost."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    submit, calls = ProcessPoolExecutor.submit, []

    def breaks_at_the_third(self, *args, **kwargs):
        calls.append(args[3])  # the cell's name
        if len(calls) == 3:
            raise BrokenProcessPool("a worker died")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", breaks_at_the_third)
    jobs = {name: (tiny_composite_run(seed=i).to_dict(), str(tmp_path / name)) for i, name in enumerate("acde")}
    recorded = []
    _run_pool(jobs, 2, recorded.append, cell_fn=dies_on_cell_b)  # no cell "b": none dies
    assert sorted((r.name, r.status) for r in recorded) == [(n, "done") for n in "acde"]
    assert calls == ["a", "c", "d", "d", "e"]  # d and e, not handed out, each retried in a pool of its own


def writes_its_pid_and_sleeps(name: str, cfg_dict: dict, run_dir: str) -> CellResult:
    """Stands in for a long cell: says which process runs it, then trains for a minute."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "pid").write_text(str(os.getpid()))
    time.sleep(60)
    return CellResult(name, "done", {})


def sweeps_sleeping_cells(jobs: dict) -> int:
    """A sweep of two workers whose cells sleep (`writes_its_pid_and_sleeps`)."""
    _run_pool(jobs, 2, print, cell_fn=writes_its_pid_and_sleeps)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"  # a zombie is gone
    except (ProcessLookupError, FileNotFoundError):  # gone, possibly between the two reads
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker states from /proc (Linux)")
def test_a_sweep_stopped_with_sigterm_takes_its_workers_with_it(tmp_path):
    """`kill PID` on a sweep must not leave its workers training on: a restarted sweep would
    train the same folders twice."""
    jobs = {name: (tiny_composite_run(seed=i).to_dict(), str(tmp_path / name)) for i, name in enumerate("ab")}
    parent = start(sweeps_sleeping_cells, jobs)
    pid_files = [tmp_path / name / "pid" for name in jobs]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert parent.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
    workers = [int(f.read_text()) for f in pid_files]
    assert all(_alive(pid) for pid in workers)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 143, parent.stderr()
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers), "a worker outlived its sweep"


def test_pool_and_in_process_runs_give_the_same_numbers(tmp_path):
    cells = {f"seed={s}": tiny_composite_run(steps=12, seed=s) for s in (0, 1)}
    alone = run_cells(cells, tmp_path / "one", workers=1, progress=False)
    pooled = run_cells(cells, tmp_path / "two", workers=2, progress=False)
    for name in cells:
        assert alone[name].status == pooled[name].status == "done"
        assert _without_time(alone[name].final) == _without_time(pooled[name].final)


def _without_time(final: dict) -> dict:
    return {k: v for k, v in final.items() if k != "elapsed_s"}


def test_the_cells_index_keeps_earlier_sweeps_into_the_same_pool(tmp_path):
    base = tiny_composite_run(steps=6)
    run_cells({"first": base}, tmp_path, progress=False)
    run_cells({"second": base.with_overrides(["train.seed=1"])}, tmp_path, progress=False)
    assert set(json.loads((tmp_path / "cells.json").read_text())) == {"first", "second"}

    shutil.rmtree(tmp_path / "first")  # a cell deleted from the pool leaves the index at the next write
    run_cells({"second": base.with_overrides(["train.seed=1"])}, tmp_path, progress=False)
    assert set(json.loads((tmp_path / "cells.json").read_text())) == {"second"}


def test_damaged_cell_folders_are_recorded_as_failed_naming_the_file(tmp_path):
    """A cell whose config.json or an earlier metrics line is damaged is neither reported done nor
    retrained over: the sweep records it as failed with the file's name and goes on; exit 2, since a
    re-run cannot fix a damaged folder (a crashed cell is exit 1: re-run to retry)."""
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0,1", "--out", str(out), "--workers", "1",
            *TINY]
    assert main(args) == 0
    (out / "seed=1" / "config.json").write_text("{bad")
    lines = (out / "seed=0" / "metrics.jsonl").read_text().splitlines()
    (out / "seed=0" / "metrics.jsonl").write_text("\n".join(["{bad", *lines[1:]]) + "\n")
    weights = _weights_mtimes(out)
    assert main(args) == 2
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    assert cells["seed=1"]["status"] == "failed" and "seed=1/config.json is not JSON" in cells["seed=1"]["error"]
    assert cells["seed=0"]["status"] == "failed"
    assert "seed=0/metrics.jsonl: line 1 is damaged" in cells["seed=0"]["error"]
    assert _weights_mtimes(out) == weights  # nothing retrained over the damaged folders
