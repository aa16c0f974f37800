"""How the sweep page's cost grows with its cells: `python -m analyses.bench.sweep_page [--cells 1000 10000]`.

For each size it writes a sweep folder in a temporary directory whose plan holds a square grid of
that many cells (two keys), a tenth of them finished (a config and a metrics.jsonl each, so
their verdicts are read from their files), the others not started, and times `write_sweep_page`
on it. It prints the seconds per size and the ratio of each to the first: a page linear in its
cells takes about 10x the time at 10x the cells (a quadratic one, 100x)."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from interp.sweep_page import write_sweep_page
from models.presets import get_preset
from models.runs import CONFIG, METRICS, write_config

PRESET = "composite-cpu"


def fake_sweep(folder: Path, n_cells: int) -> None:
    """A sweep plan of about `n_cells` cells (a side x side grid), every tenth cell finished."""
    side = math.isqrt(n_cells)
    base = get_preset(PRESET)
    grid = {"model.init_gamma": [round(0.1 + i / side, 5) for i in range(side)],
            "train.lr": [round(1e-4 * (1 + i), 8) for i in range(side)]}
    cells = {}
    for i, gamma in enumerate(grid["model.init_gamma"]):
        for j, lr in enumerate(grid["train.lr"]):
            name = f"init_gamma={gamma}__lr={lr}"
            cells[name] = {"point": {"model.init_gamma": gamma, "train.lr": lr}}
            if (i * side + j) % 10 == 0:
                run = folder / name
                run.mkdir(parents=True)
                write_config(run, base)
                record = {"step": base.train.steps, "train_loss": 0.1, "eval_loss": 0.2, "elapsed_s": 1.0,
                          "acc_seen": 0.95, "held_out_inferential": 0.8, "held_out_symmetric": 0.1}
                (run / METRICS).write_text(json.dumps(record) + "\n")
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"preset": PRESET, "grid": grid, "base": base.to_dict(), "cells": cells}
    (folder / "sweep_plan.json").write_text(json.dumps(plan))
    assert (folder / next(iter(cells)) / CONFIG).is_file()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m analyses.bench.sweep_page", description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[1000, 10000],
                        help="sizes to time (default 1000 10000)")
    args = parser.parse_args()
    timings = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.cells:
            folder = Path(tmp) / f"sweep-{n}"
            fake_sweep(folder, n)
            started = time.perf_counter()
            page, _, _ = write_sweep_page(folder)
            seconds = time.perf_counter() - started
            timings.append(seconds)
            ratio = seconds / timings[0]
            print(f"{len(page['cells']):>6} cells: {seconds:7.2f} s  (x{ratio:.1f} the first size's time)", flush=True)


if __name__ == "__main__":
    main()
