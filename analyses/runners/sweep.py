"""Run many training cells, each an ordinary run folder under one root, resumably: a finished
cell is skipped, a killed one resumes from its checkpoint, a diverged or crashed one is
recorded and never stops the others.

Backends: `local` trains in this process (workers=1, with the caller's torch threads) or in a
pool of worker processes (forkserver, so no worker inherits the parent's threads or locks; the
server imports torch and the trainer once and each worker is a fork of it, not a fresh import),
each limited to cores // workers torch threads; `ray` runs each cell as a Ray task, on a
cluster (`address`) or on a local Ray instance. A cell's result depends only on its config, so every backend
gives the same numbers for the same grid.

A sweep (`run_sweep`, `workbench sweep`) is a grid over config keys on top of a preset:
`{"model.init_gamma": [0.3, 0.5], "train.seed": [0, 1]}` gives four cells named
`init_gamma=0.3__seed=0` ...; it writes `sweep_plan.json` (the grid) when it starts, and
`sweep.json` (the index) and its page (`report.html`, `sweep_page.json`) when it ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from tqdm import tqdm

from analyses.runners.cell import CellFn, CellResult, call_with_threads, train_cell
from analyses.runners.ensemble import train_ensembles
from analyses.runners.lifeline import die_with
from models.config import RunConfig, parse_value
from models.runs import RunFolderError, atomic_write_bytes, read_json
from tasks import ConfigError

BACKENDS = ("local", "ray")
# what a pool's fork server imports before it forks workers (read when the server starts: the first
# pool of a process); without them every worker imports torch and TransformerLens anew, seconds each
WORKER_IMPORTS = ("torch", "models.train")
INDEX, PLAN, CELLS_INDEX = "sweep.json", "sweep_plan.json", "cells.json"


# ---------------------------------------------------------------------------------------------
# Running cells on a backend


def machine_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by WORKBENCH_THREADS when set
    (`/work/bin/cpu-slot`-style wrappers grant one core that way)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    granted = os.environ.get("WORKBENCH_THREADS")
    return max(1, min(cores, int(granted))) if granted and granted.isdigit() else cores


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of `workers` parallel cells, so that workers x threads <= cores."""
    return max(1, machine_cores() // workers)


def run_cells(cells: dict[str, RunConfig], root: str | Path, *, workers: int | None = 1, backend: str = "local",
              address: str | None = None, progress: bool = True, ensemble: str = "auto") -> dict[str, CellResult]:
    """Train every cell into `root/<name>` and return their results by name (in `cells` order).

    workers: cells trained at once (None: one per core). Finished and diverged cells are
    skipped, partial ones resume, failed ones are retried. `root/cells.json` is updated as each
    cell ends, so a killed sweep leaves an index of what it finished; it keeps the entries of
    earlier calls on the same root (a pool several studies fill) whose folders still exist.
    ensemble: auto|on|off, whether same-shape cells train as one ensemble in this process
    (analyses/runners/ensemble.py; local backend only), before the cells left train as above.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is unknown; use one of {BACKENDS}")
    if address is not None and backend != "ray":
        raise ConfigError(f"an address ({address}) only applies to --backend ray")
    workers = machine_cores() if workers is None else workers
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    root = Path(root)
    jobs = {name: (cfg.to_dict(), str(check_cell_folder(root, name))) for name, cfg in cells.items()}
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, CellResult] = {}
    bar = tqdm(total=len(jobs), desc=f"cells of {root.name}", disable=not progress, unit="cell",
               mininterval=1.0 if _is_tty() else 30.0)

    def record(result: CellResult) -> None:
        results[result.name] = result
        bar.update(1)
        bar.set_postfix(_status_counts(results.values()))
        _update_index(root / CELLS_INDEX, {k: results[k].to_dict() for k in jobs if k in results})

    left = jobs if backend == "ray" else train_ensembles(jobs, ensemble, record, progress)
    if backend == "ray":
        from analyses.runners.ray_backend import run_ray  # Ray only where it is asked for

        run_ray(jobs, workers, address, record)
    elif workers == 1:  # in this process, with the caller's torch threads
        for name, (cfg_dict, run_dir) in left.items():
            record(train_cell(name, cfg_dict, run_dir))
    elif left:
        _run_pool(left, workers, record)
    bar.close()
    return {name: results[name] for name in jobs}


def _run_pool(jobs: dict[str, tuple[dict, str]], workers: int, record: Callable[[CellResult], None],
              cell_fn: CellFn = train_cell) -> None:
    """A process pool over the jobs. A worker that dies (segfault, out of memory) breaks the pool
    and every cell running beside it; those cells are then retried one per fresh process, so
    only the culprit ends `failed`."""
    broken = _pool_round(jobs, workers, record, cell_fn)
    for name in broken:
        if _pool_round({name: jobs[name]}, 1, record, cell_fn):
            record(CellResult(name, "failed", error="the worker process died (killed, out of memory or crashed)"))


def _pool_round(jobs: dict[str, tuple[dict, str]], workers: int, record: Callable[[CellResult], None],
                cell_fn: CellFn) -> list[str]:
    """Run the jobs in one pool; return the names of those lost to a broken pool."""
    threads = threads_per_worker(workers)
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":  # the server imports torch and the trainer once; each worker is a fork of it
        context.set_forkserver_preload(list(WORKER_IMPORTS))
    lost: list[str] = []
    # every worker dies with this process, however it ends (analyses/runners/lifeline.py)
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)) or 1, mp_context=context,
                               initializer=die_with, initargs=(os.getpid(),))
    try:
        with _stop_signals_raise():
            futures: dict[Any, str] = {}
            for name, job in jobs.items():
                try:
                    futures[pool.submit(call_with_threads, cell_fn, threads, name, *job)] = name
                except BrokenProcessPool:  # a worker died before every cell was handed out: the rest are lost too
                    lost += [n for n in jobs if n not in futures.values()]
                    break
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    try:
                        record(future.result())
                    except BrokenProcessPool:
                        lost.append(futures[future])
    except BaseException:  # killed (SIGTERM, Ctrl-C) or crashed: no worker may train on unwatched
        _stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [name for name in jobs if name in lost]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # `kill PID`; a closed terminal or a lost ssh session


@contextlib.contextmanager
def _stop_signals_raise():
    """While inside, SIGTERM (`kill PID`) and SIGHUP (the terminal closed) raise
    SystemExit(128 + signal) in the main thread, as Ctrl-C raises KeyboardInterrupt, so the
    caller stops its workers before it exits. A SIGKILL cannot be caught: for it, and for any
    other death, each worker watches this process itself (analyses/runners/lifeline.py). Elsewhere than
    the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = {signum: signal.signal(signum, terminated) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes (the executor has no public way before Python 3.14's
    terminate_workers). A cell stopped this way resumes from its last checkpoint next time."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def _status_counts(results: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return counts


def _is_tty() -> bool:
    return sys.stderr.isatty()


def _write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=1, default=float).encode())


def _update_index(path: Path, entries: dict[str, Any]) -> None:
    """Write `entries` into the index at `path`, keeping what is there for other cells whose
    folders still exist. It is read just before each write: two sweeps filling one pool at once
    lose an entry only when their writes interleave, and the losing sweep's next write restores it."""
    try:
        index = read_json(path)
    except (FileNotFoundError, RunFolderError):  # none yet, or damaged: the entries of this call are what counts
        index = {}
    index = index if isinstance(index, dict) else {}
    kept = {name: entry for name, entry in index.items() if name not in entries and (path.parent / name).is_dir()}
    _write_json(path, {**kept, **entries})


# ---------------------------------------------------------------------------------------------
# Grids and sweeps


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """`["model.init_gamma=0.3,0.5", "train.seed=0,1"]` -> {"model.init_gamma": [0.3, 0.5], ...};
    each value is parsed as JSON when it parses (numbers, true/false, null), else kept a string."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or "." not in key or not raw.strip():
            raise ConfigError(f"--grid {item!r} is not of the form section.key=v1,v2,...")
        if key in grid:
            raise ConfigError(f"--grid names {key} twice; give all its values in one --grid")
        grid[key] = [parse_value(v.strip(), f"--grid {key}") for v in raw.split(",")]
    return grid


def cell_name(assignment: dict[str, Any]) -> str:
    """A folder name for one grid point: `init_gamma=0.3__seed=0` (the key's last part). A value
    is one name, never a path: "/" (and "\\", and "%" itself) are percent-encoded, so that
    `train.init_from=../../x` names the folder `init_from="..%2F..%2Fx"` inside the sweep's."""
    return "__".join(f"{key.rpartition('.')[2]}={_one_name(json.dumps(value))}" for key, value in assignment.items())


def _one_name(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")


NAME_MAX = 255  # bytes in one file name (Linux, most file systems)


def check_cell_folder(root: Path, name: str) -> Path:
    """`root/name`, once checked to be one folder directly inside `root` with a name the file
    system takes; ConfigError (exit 2) naming the cell otherwise. Every cell folder is made here."""
    size = len(os.fsencode(name))
    if size > NAME_MAX:
        raise ConfigError(f"cell {name[:40]}... would be a folder name of {size} bytes, more than the file system "
                          f"takes ({NAME_MAX}); use shorter grid values")
    if name in ("", ".", "..") or Path(name).name != name or os.sep in name or "\0" in name:
        raise ConfigError(f"cell name {name!r} is not one folder name inside {root}; it would be written elsewhere")
    return root / name


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, first key slowest."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def grid_cells(base: RunConfig, grid: dict[str, list[Any]]) -> dict[str, RunConfig]:
    """One validated RunConfig per grid point, by cell name."""
    short = [key.rpartition(".")[2] for key in grid]
    if len(set(short)) < len(short):
        raise ConfigError(f"--grid keys {sorted(grid)} end in the same name; cell folders would collide")
    cells = {cell_name(point): base.with_overrides([f"{k}={json.dumps(v)}" for k, v in point.items()])
             for point in grid_points(grid)}
    for name in cells:
        check_cell_folder(Path("."), name)
    return cells


def run_sweep(base: RunConfig, grid: dict[str, list[Any]], out: str | Path, *, preset: str | None = None,
              workers: int | None = None, backend: str = "local", address: str | None = None,
              progress: bool = True, ensemble: str = "auto") -> dict[str, Any]:
    """Train the grid's cells under `out` and write `out/sweep.json`, then the sweep's page
    (`out/report.html` and `out/sweep_page.json`, interp/sweep_page.py); `out/sweep_plan.json`
    (grid and cells) is written first, so a sweep in progress has a page too. Returns the index
    (what sweep.json holds)."""
    out = Path(out)
    cells = grid_cells(base, grid)
    points = {cell_name(p): p for p in grid_points(grid)}
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)  # the plan: what the sweep's page of a sweep in progress reads
    _write_json(out / PLAN, {"preset": preset, "grid": grid, "base": base.to_dict(),
                             "cells": {name: {"point": point} for name, point in points.items()}})
    results = run_cells(cells, out, workers=workers, backend=backend, address=address, progress=progress,
                        ensemble=ensemble)
    index = {
        "preset": preset, "grid": grid, "base": base.to_dict(), "backend": backend,
        "workers": machine_cores() if workers is None else workers,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "counts": _status_counts(results.values()),
        "cells": {name: {"point": points[name], **_summary(result)} for name, result in results.items()},
    }
    _write_json(out / INDEX, index)
    from interp.sweep_page import write_sweep_page  # here: the cells' worker processes import this module

    write_sweep_page(out)
    return index


def _summary(result: CellResult) -> dict[str, Any]:
    scalars = {k: v for k, v in result.final.items() if isinstance(v, int | float | str | None)}
    summary = {"status": result.status, "seconds": round(result.seconds, 2), "final": scalars, "error": result.error}
    return {**summary, "refused": True} if result.refused else summary
