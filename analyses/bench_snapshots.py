"""What snapshots cost (issue 40): the same run trained with the default snapshots and without
any, one after the other in one process, for the lego-cpu and composite-matched presets; prints
the training-time ratio and the snapshots' disk against the final weights. Ratios are taken side
by side, alternating the two modes, so a noisy machine slows both alike.

    workbench benchmark --snapshots [--quick]

The runs are shorter than the presets' (`STEPS`) but keep the default 20 snapshots, so the time
overhead printed is an upper bound for the full-length runs (the same writes over fewer steps)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from models.presets import get_preset
from models.runs import WEIGHTS
from models.snapshots import snapshot_disk_bytes
from models.train import Trainer

STEPS = {"lego-cpu": 300, "composite-matched": 600}
QUICK_STEPS = {"lego-cpu": 60, "composite-matched": 60}


def _config(preset: str, steps: int, snapshots: int):
    # the stop rule and compile off: both modes train exactly `steps` steps, the same kernels
    return get_preset(preset).with_overrides([
        f"train.steps={steps}", f"train.snapshots={snapshots}", "train.plateau_evals=null", "train.plateau_min_steps=0",
        "train.plateau_watch=[]", "train.compile=false", "train.device=\"cpu\""])


def time_run(preset: str, steps: int, snapshots: int, folder: Path) -> float:
    """Seconds of `Trainer.fit` for one run of `preset` into `folder`."""
    started = time.perf_counter()
    Trainer(_config(preset, steps, snapshots), folder, progress=False).fit()
    return time.perf_counter() - started


def snapshot_cost(preset: str, steps: int, repeats: int) -> dict[str, float]:
    """Median seconds with the default snapshots and without, their ratio, and the disk ratio."""
    with_snaps, without = [], []
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp:
        for i in range(repeats):
            without.append(time_run(preset, steps, 0, Path(tmp) / f"off-{i}"))
            with_snaps.append(time_run(preset, steps, 20, Path(tmp) / f"on-{i}"))
        run = Path(tmp) / "on-0"
        disk, weights = snapshot_disk_bytes(run), (run / WEIGHTS).stat().st_size
    on, off = statistics.median(with_snaps), statistics.median(without)
    return {"steps": steps, "seconds_with": on, "seconds_without": off, "time_ratio": on / off,
            "snapshot_bytes": disk, "weights_bytes": weights, "disk_ratio": disk / weights}


def run_snapshot_benchmark(quick: bool = False) -> dict[str, dict[str, float]]:
    results = {}
    for preset, steps in (QUICK_STEPS if quick else STEPS).items():
        cost = snapshot_cost(preset, steps, repeats=1 if quick else 2)
        results[preset] = cost
        print(f"{preset}, {steps} steps: {cost['seconds_with']:.1f} s with 20 snapshots, {cost['seconds_without']:.1f} s "
              f"without: time x{cost['time_ratio']:.3f} ({cost['time_ratio'] - 1:+.1%}); snapshots "
              f"{cost['snapshot_bytes'] / 1e6:.2f} MB = {cost['disk_ratio']:.1f}x the final weights "
              f"({cost['weights_bytes'] / 1e6:.2f} MB)")
    return results
