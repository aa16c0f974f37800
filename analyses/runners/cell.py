"""One cell of a sweep: train (or resume, or skip) one run folder under its lock, and say what it
ended as. Module-level and picklable, so every backend (a process pool, Ray, an ensemble)
calls the same function; analyses/runners/sweep.py runs many of them."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from models.config import RunConfig
from models.runs import CONFIG, RunFolderError, read_config, read_metrics, run_state, same_recipe
from models.safe_files import FolderBusy, run_lock

CellFn = Callable[[str, dict[str, Any], str], "CellResult"]
LOCK_GRACE_S = 10.0  # how long a cell waits for its folder's lock (a killed sweep's worker dies in ~1 s)


@dataclass
class CellResult:
    """What one cell ended as: `done`, `diverged` (the loss became NaN/inf) or `failed` (crashed,
    or `refused`: its folder holds a damaged file or another run, which a re-run cannot fix)."""

    name: str
    status: str
    final: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    refused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_cell(name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """Train (or resume, or skip) one cell. Module-level and picklable, so any backend can call it.
    The cell's folder is locked first, waiting up to LOCK_GRACE_S for a worker of a killed sweep
    to die; a folder still busy after that is `failed` (a re-run retries it), not refused."""
    try:
        with run_lock(run_dir, wait=LOCK_GRACE_S):
            return _train_locked_cell(name, RunConfig.from_dict(cfg_dict), Path(run_dir))
    except FolderBusy as err:
        return CellResult(name, "failed", error=f"{err}; re-run the sweep once it has finished")


def settled_cell(name: str, cfg: RunConfig, path: Path) -> tuple[CellResult | None, str]:
    """A cell with nothing to train: its result (finished, diverged, or refused: the folder holds
    another config) and its run state; else None and the state it trains from. RunFolderError
    where the folder is damaged."""
    if (path / CONFIG).exists() and not same_recipe(read_config(path), cfg):
        return CellResult(name, "failed", error=f"{path} holds a run with another config; move it away",
                          refused=True), ""
    state = run_state(path, cfg)
    if state in ("done", "diverged"):
        metrics = read_metrics(path)
        return CellResult(name, state, metrics[-1], float(metrics[-1].get("elapsed_s", 0.0))), state
    return None, state


def _train_locked_cell(name: str, cfg: RunConfig, path: Path) -> CellResult:
    """`train_cell` under the cell's lock."""
    from models.train import TrainingDiverged, train

    try:  # a cell folder with a damaged config or metrics is recorded as failed, naming the file
        settled, state = settled_cell(name, cfg, path)
    except RunFolderError as err:
        return CellResult(name, "failed", error=str(err), refused=True)
    if settled is not None:
        return settled
    started = time.perf_counter()
    try:
        result = train(cfg, path, resume=state == "partial", progress=False)
    except RunFolderError as err:
        return CellResult(name, "failed", seconds=time.perf_counter() - started, error=str(err), refused=True)
    except TrainingDiverged as err:
        return CellResult(name, "diverged", read_metrics(path)[-1], time.perf_counter() - started, str(err))
    except Exception:  # a crashed cell is recorded, the sweep goes on
        return CellResult(name, "failed", seconds=time.perf_counter() - started, error=traceback.format_exc(limit=5))
    return CellResult(name, "done", result.final, result.seconds)


def call_with_threads(cell_fn: CellFn, threads: int, name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """Run one cell with `threads` torch threads (restored afterwards, in case the process
    is reused)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return cell_fn(name, cfg_dict, run_dir)
    finally:
        torch.set_num_threads(before)
