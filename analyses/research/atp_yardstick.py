"""Attribution judged the way AtP* judges it (Kramar et al. 2024): verifying cells by exact
patching in an estimate's order, how much of the exact sweep is needed before all of exact's
top-k cells (by |effect|) are verified. Across trained runs, side by side per estimate.

    python -m analyses.research.atp_yardstick RUN_DIR [RUN_DIR ...] [--n-pairs 64] [--k 3] [--ig-steps 4]

Per run, the pairs and the label slot are the ones `workbench analyze` uses (aligned pairs; the
deepest supervised slot the model fits). Cells and estimates:
- head outputs, queries and keys, by position (layer x pos x head) and per head (layer x head);
- plain one-step attribution (AtP), GradDrop, integrated gradients (`--ig-steps` steps), and for
  queries and keys the QK fix, alone and with GradDrop (interp.atp, shared with `workbench
  analyze` and `workbench benchmark --patching`).
Spearman with exact patching is printed next to each, for comparison with the older yardstick.
Over the runs: the median and worst fraction, and the curve behind them: per verification budget
(BUDGETS, fractions of the exact sweep), the share of runs whose exact top k are all recovered
within it. Per head there is no target; the curve is the figure to report.
Cell kinds with no more than k cells (a one-head model's heads) are skipped: any order verifies
them all.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Any

import torch

from interp.atp import judge_all_cells
from interp.patching import logit_diff_metric
from interp.task_analysis import counterfactual_pairs
from models.runs import load_run

BUDGETS = (0.05, 0.10, 0.25, 0.50, 0.75)  # fractions of the exact sweep verified in the estimate's order


def yardstick(run: Any, n_pairs: int, k: int, ig_steps: int, seed: int = 0) -> dict[tuple[str, str], tuple[float,
                                                                                                           float, int]]:
    """(cells, estimate) -> (fraction of the exact sweep to verify, Spearman, number of cells)."""
    clean, corrupted, slot, _ = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    metric = logit_diff_metric(clean, corrupted, slot)
    judged = judge_all_cells(run.model, clean.tokens, corrupted.tokens, metric, ig_steps=ig_steps, k=k)
    return {(cells, name): (one.fraction, one.spearman, one.n_cells)
            for cells, kinds in judged.items() for name, one in kinds.estimates.items()}


def recovery_curve(fractions: list[float], budgets: tuple[float, ...] = BUDGETS) -> list[float]:
    """Per budget, the share of runs whose exact top k cells are all verified within that fraction
    of the exact sweep (the empirical distribution of the runs' verified fractions)."""
    return [sum(fraction <= budget + 1e-9 for fraction in fractions) / len(fractions) for budget in budgets]


def curve_table(table: dict[tuple[str, str], list[float]], budgets: tuple[float, ...] = BUDGETS) -> list[str]:
    """One line per (cells, estimate): its number of runs and its recovery curve, in percent."""
    lines = [f"{'cells':9s} {'estimate':16s} {'runs':>4s} " + " ".join(f"{budget:>5.0%}" for budget in budgets)]
    for (cells, name), fractions in table.items():
        curve = " ".join(f"{share:5.0%}" for share in recovery_curve(fractions, budgets))
        lines.append(f"{cells:9s} {name:16s} {len(fractions):4d} {curve}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="trained run folders")
    parser.add_argument("--n-pairs", type=int, default=64)
    parser.add_argument("--k", type=int, default=3, help="exact's top k cells that must be verified")
    parser.add_argument("--ig-steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table: dict[tuple[str, str], list[float]] = {}
    print(f"fraction of the exact sweep verified before exact's top {args.k} cells are (Spearman in brackets)")
    for run_dir in args.run_dirs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            run = load_run(run_dir)
        found = yardstick(run, args.n_pairs, args.k, args.ig_steps)
        for (cells, name), (fraction, rho, n_cells) in found.items():
            table.setdefault((cells, name), []).append(fraction)
            print(f"{run_dir:36s} {cells:9s} ({n_cells:4d} cells) {name:16s} {fraction:6.3f}  ({rho:5.2f})", flush=True)
    print(f"\nover {len(args.run_dirs)} runs: median / worst fraction verified")
    for (cells, name), fractions in table.items():
        print(f"{cells:9s} {name:16s} {statistics.median(fractions):6.3f} / {max(fractions):6.3f}")
    print(f"\nshare of runs whose exact top {args.k} cells are all verified within each budget (fraction of the "
          "exact sweep, verified in the estimate's order)")
    print("\n".join(curve_table(table)))


if __name__ == "__main__":
    main()
