"""A sweep's or study's cells of one shape trained as one ensemble (models/ensemble.py), with a
progress bar per group; `--ensemble auto|on|off` decides where.

- off: every cell alone (a lone run, in this process or the worker pool).
- on: every group of two or more same-shape cells (`group_by_shape`) as one ensemble, on any device.
- auto (default): on for CUDA, where tiny models are bound by kernel launches; off on the CPU,
  where the matched phase diagram trained slower as ensembles than as cells in the worker pool,
  and where a lone run's weights are bit-identical from run to run (a member of an ensemble with
  biases equals its lone run only within rounding). The numbers are in docs/ensembles.md.

Cells a group trains are recorded like cells trained alone (`CellResult`), so sweep.json,
cells.json and the page do not depend on the mode; the cells left are returned to the caller.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models.config import RunConfig
from models.ensemble import group_by_shape
from tasks import ConfigError

ENSEMBLE_MODES = ("auto", "on", "off")


def check_mode(mode: str) -> str:
    if mode not in ENSEMBLE_MODES:
        raise ConfigError(f"--ensemble {mode!r} is unknown; use one of {ENSEMBLE_MODES}")
    return mode


def ensembles(mode: str, cfg: RunConfig) -> bool:
    """Whether a group of cells like `cfg` trains as one ensemble under `mode`."""
    if mode != "auto":
        return mode == "on"
    from models.device import resolve_device

    return resolve_device(cfg.train.device).type == "cuda"


def train_ensembles(jobs: dict[str, tuple[dict, str]], mode: str, record: Callable[[Any], None],
                    progress: bool = True) -> dict[str, tuple[dict, str]]:
    """Train the groups of `jobs` (name -> (config dict, run folder)) that `mode` ensembles,
    calling `record(CellResult)` for each of their cells; return the jobs left to train alone."""
    check_mode(mode)
    cells = {name: RunConfig.from_dict(cfg) for name, (cfg, _) in jobs.items()}
    left = dict(jobs)
    for group in group_by_shape(cells):
        if len(group) < 2 or not ensembles(mode, cells[group[0]]):
            continue
        for result in _train_group({name: (cells[name], Path(jobs[name][1])) for name in group}, progress):
            left.pop(result.name, None)
            record(result)
    return left


def _train_group(group: dict[str, tuple[RunConfig, Path]], progress: bool) -> list[Any]:
    """One group: each cell checked as `train_cell` checks it (finished, diverged and refused
    cells are recorded without training), the rest trained together. A partial cell's folder is
    checked as its restore will check it (`RunFolder.resume_point`), and every folder for links,
    before the group is built, so that a damaged one leaves the group with its own error and the
    others train on."""
    from analyses.runners.cell import CellResult, settled_cell
    from models.run_folder import RunFolder
    from models.runs import RunFolderError, read_metrics
    from models.train import Trainer, TrainingDiverged, train_runs

    results, members, names = [], [], []
    for name, (cfg, path) in group.items():
        try:
            settled, state = settled_cell(name, cfg, path)
            if settled is not None:
                results.append(settled)
                continue
            folder = RunFolder(path)
            if path.is_dir():  # what the members' locks check, checked per member
                folder.check_no_folder_links()
            if state == "partial":
                folder.resume_point(cfg.train.steps, cfg.train.eval_every)
            members.append(Trainer(cfg, folder, resume=state == "partial", progress=False))
            names.append(name)
        except (RunFolderError, ConfigError) as err:
            results.append(CellResult(name, "failed", error=str(err), refused=isinstance(err, RunFolderError)))
    if not members:
        return results
    started = time.perf_counter()
    try:
        outcomes = train_runs(members, progress=progress, desc=f"ensemble of {len(members)} ({names[0]}, ...)")
    except TrainingDiverged as err:  # one cell left to train, trained alone: it raises
        outcomes = [err]
    except Exception:  # the whole group crashed: each cell is failed, and a re-run resumes it
        error = traceback.format_exc(limit=5)
        return results + [CellResult(n, "failed", seconds=time.perf_counter() - started, error=error) for n in names]
    for name, member, outcome in zip(names, members, outcomes):
        if isinstance(outcome, TrainingDiverged):
            results.append(CellResult(name, "diverged", read_metrics(member.folder.path)[-1], member.elapsed,
                                      str(outcome)))
        else:
            results.append(CellResult(name, "done", outcome.final, outcome.seconds))
    return results

