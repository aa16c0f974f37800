"""The memory estimate (models/memory.py) against the measured peak of short training runs, one
fresh process per shape (a process's peak RSS only grows). Prints a table:

    python -m analyses.research.memory_table            # the shapes below, about a minute on one core

Measured = the process's peak resident set (getrusage ru_maxrss) less its resident set just
before the trainer is built (torch and TransformerLens imported), i.e. what the run itself added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = ["train.steps=2", "train.eval_every=2", "train.checkpoint_every=2", "train.warmup_steps=1", "train.device=cpu"]
SHAPES = {  # name -> (preset, overrides); each one part of the estimate dominates
    "wide model": ("composite-cpu", ["model.d_model=512", "model.d_mlp=2048", "model.n_heads=8", "model.n_layers=4"]),
    "large batch": ("composite-cpu", ["train.batch_size=16384"]),
    "large eval set": ("composite-cpu", ["train.eval_size=100000"]),
    "large training set": ("composite-cpu", ["train.n_train=4000000"]),
    "lego, large batch": ("lego-cpu", ["train.batch_size=1024", "train.eval_size=1000"]),
}


def measure(preset: str, overrides: list[str]) -> dict[str, float]:
    """Train `preset` with `overrides` for two steps in a fresh process: estimated and measured
    peak bytes above the process's size before training."""
    with tempfile.TemporaryDirectory(prefix="memory-table-") as folder:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        child = subprocess.run([sys.executable, "-m", "analyses.research.memory_table", "--child", preset, folder,
                                *RUN, *overrides], env=env, capture_output=True, text=True, timeout=600)
    if child.returncode != 0:
        raise RuntimeError(f"measuring {preset} {overrides} failed: {child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _child(preset: str, folder: str, overrides: list[str]) -> None:
    """In the measuring process: train, print {"estimate", "measured"} in bytes."""
    import resource

    import interp.tasks  # noqa: F401 (registers each task's presets)
    from models.memory import estimate_peak
    from models.presets import get_preset
    from models.train import train
    from tasks import make_task

    cfg = get_preset(preset).with_overrides(overrides)
    estimate = estimate_peak(cfg, make_task(cfg.task)).total
    before = _resident_bytes()
    train(cfg, Path(folder) / "run", progress=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"estimate": estimate, "measured": peak - before}))


def _resident_bytes() -> int:
    """This process's resident set now (VmRSS)."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def table(shapes: dict[str, tuple[str, list[str]]] = SHAPES) -> list[tuple[str, float, float]]:
    """(shape, estimated MB, measured MB) per shape."""
    rows = []
    for name, (preset, overrides) in shapes.items():
        result = measure(preset, overrides)
        rows.append((name, result["estimate"] / 1e6, result["measured"] / 1e6))
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    print(f"{'shape':20s} {'estimate MB':>12s} {'measured MB':>12s} {'ratio':>6s}")
    for name, estimate, measured in table():
        print(f"{name:20s} {estimate:12.0f} {measured:12.0f} {estimate / measured:6.2f}")


if __name__ == "__main__":
    main()
