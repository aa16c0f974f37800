"""What snapshots cost (issue 40): the same run trained with the default snapshots and without
any, one after the other in one process, for the lego-cpu and composite-matched presets; prints
the training-time ratio and the snapshots' disk against the final weights. Ratios are taken side
by side, alternating the two modes, so a noisy machine slows both alike; and the seconds spent
inside the snapshot code itself are clocked, a share that machine noise barely moves.

    workbench benchmark --snapshots [--quick]

The runs are shorter than the presets' (`STEPS`) but keep the default 20 snapshots, so the time
overhead printed is an upper bound for the full-length runs (the same writes over fewer steps)."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import interp.tasks  # noqa: F401 (registers each task's presets)
from models.presets import get_preset
from models.runs import WEIGHTS
from models.snapshots import SnapshotKeeper, snapshot_disk_bytes
from models.train import train

STEPS = {"lego-cpu": 300, "composite-matched": 600}
QUICK_STEPS = {"lego-cpu": 60, "composite-matched": 60}


def _config(preset: str, steps: int, snapshots: int):
    # the stop rule and compile off: both modes train exactly `steps` steps, the same kernels
    return get_preset(preset).with_overrides([
        f"train.steps={steps}", f"train.snapshots={snapshots}", "train.plateau_evals=null", "train.plateau_min_steps=0",
        "train.plateau_watch=[]", "train.compile=false", "train.device=\"cpu\""])


@contextlib.contextmanager
def snapshot_clock() -> Iterator[list[float]]:
    """Seconds spent inside the trainer's snapshot work (every SnapshotKeeper method it calls),
    summed into the yielded list's one element: the cost itself, which machine noise does not touch."""
    spent = [0.0]
    originals = {name: getattr(SnapshotKeeper, name) for name in ("start", "resume", "after_step", "at_evaluation")}

    def timed(method):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        return wrapper

    for name, method in originals.items():
        setattr(SnapshotKeeper, name, timed(method))
    try:
        yield spent
    finally:
        for name, method in originals.items():
            setattr(SnapshotKeeper, name, method)


def time_run(preset: str, steps: int, snapshots: int, folder: Path) -> tuple[float, float]:
    """Seconds of training (`models.train.train`) one run of `preset` into `folder`, and of its snapshot work."""
    with snapshot_clock() as spent:
        started = time.perf_counter()
        train(_config(preset, steps, snapshots), folder, progress=False)
        return time.perf_counter() - started, spent[0]


def snapshot_cost(preset: str, steps: int, repeats: int) -> dict[str, float]:
    """Median seconds with the default snapshots and without (runs alternated), the median of the
    pairs' ratios, the share of a run spent in snapshot work, and the disk ratio."""
    with_snaps, without, inside = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp:
        for i in range(repeats):
            without.append(time_run(preset, steps, 0, Path(tmp) / f"off-{i}")[0])
            seconds, spent = time_run(preset, steps, 20, Path(tmp) / f"on-{i}")
            with_snaps.append(seconds)
            inside.append(spent / seconds)
        run = Path(tmp) / "on-0"
        disk, weights = snapshot_disk_bytes(run), (run / WEIGHTS).stat().st_size
    ratios = [on / off for on, off in zip(with_snaps, without)]
    return {"steps": steps, "seconds_with": statistics.median(with_snaps),
            "seconds_without": statistics.median(without),
            "time_ratio": statistics.median(ratios), "snapshot_share": statistics.median(inside),
            "snapshot_bytes": disk, "weights_bytes": weights, "disk_ratio": disk / weights}


def run_snapshot_benchmark(quick: bool = False) -> dict[str, dict[str, float]]:
    results = {}
    for preset, steps in (QUICK_STEPS if quick else STEPS).items():
        cost = snapshot_cost(preset, steps, repeats=1 if quick else 3)
        results[preset] = cost
        print(f"{preset}, {steps} steps: {cost['seconds_with']:.1f} s with 20 snapshots, "
              f"{cost['seconds_without']:.1f} s "
              f"without: time x{cost['time_ratio']:.3f} (median of alternated pairs); the snapshot work itself "
              f"{cost['snapshot_share']:.2%} of the run; snapshots {cost['snapshot_bytes'] / 1e6:.2f} MB = "
              f"{cost['disk_ratio']:.1f}x the final weights ({cost['weights_bytes'] / 1e6:.2f} MB)")
    return results
