"""Composite-function studies (docs/papers.md, section 2): does the initialisation scale decide
whether a transformer fits the held-out anchor pair (4,3) by inference (x-10) or by copying
its mirror pair (x-6)?

- composite-phase: the verdict per (gamma, depth) cell over seeds (and learning rates at paper
  scale), drawn as the paper's Figure 2, with each cell's vector and complexity measures.
- composite-mechanism: a small-gamma and a large-gamma 2-layer model side by side: attention
  flow, residual patching at the key and anchor positions per layer, probes for key,
  intermediate and target (Figure 3); last-token cosine similarity for equal targets, query
  condensation and the embedding spectrum (Figures 4-5).
- composite-lr-wd: learning rate x weight decay at one (gamma, depth) (finding 5).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from analyses.runners.study import Study, StudyContext, how_it_ended, run_folders
from analyses.studies.composite_cells import (
    PROTOCOLS,
    SCALES,
    SEEN_LEARNED,
    VERDICT_MARK,
    base_config,
    complexity_row,
    scale_params,
    train_and_measure,
    with_model,
    with_seeds,
)
from analyses.studies.composite_mechanism import mechanism_by_key_position, run_mechanism
from interp.report import figure_html, table_html
from interp.tasks.composite import (
    classify_composite,
    composite_verdict,
    held_out_on_training_keys,
    held_out_other_answers,
)
from models.config import RunConfig
from models.runs import load_run, read_json

# ---------------------------------------------------------------------------------------------
# composite-phase


def aggregate_phase(points: dict[str, dict[str, Any]], measured: dict[str, dict[str, Any]],
                    d_model: int | None = None) -> dict[str, dict[str, Any]]:
    """Per (gamma, depth): the paper's protocol. Per seed keep the learning rate with the best
    seen-pair accuracy; average the rates over seeds; the verdict of the averages. Beside it,
    the paper's other reading: per seed and mapping the best held-out rate over the learning
    rates whose run learned the seen pairs (>= 0.9), averaged over seeds (0 where none did).
    With `d_model`, each cell's initial weight std d_model^-gamma (of the matrices that read
    the residual stream), since the same gamma is a different std at another width."""
    by_seed: dict[tuple, dict[int, dict[str, Any]]] = defaultdict(dict)
    best_by_seed: dict[tuple, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for name, point in points.items():
        key = (point["model.init_gamma"], point["model.n_layers"])
        seed = point.get("train.seed", 0)
        m = measured[name]
        best = by_seed[key].get(seed)
        if best is None or m.get("seen_accuracy", -1) > best.get("seen_accuracy", -1):
            by_seed[key][seed] = m
        learned = m.get("seen_accuracy", 0.0) >= SEEN_LEARNED
        for mapping in ("held_out_inferential", "held_out_symmetric"):
            found = best_by_seed[key][seed].get(mapping, 0.0)
            best_by_seed[key][seed][mapping] = max(found, m.get(mapping, 0.0) if learned else 0.0)
    table = {}
    for (gamma, depth), seeds in sorted(by_seed.items()):
        rows = list(seeds.values())
        mean = {k: sum(r.get(k, 0.0) for r in rows) / len(rows)
                for k in ("seen_accuracy", "held_out_inferential", "held_out_symmetric")}
        bests = list(best_by_seed[gamma, depth].values())
        table[f"{gamma},{depth}"] = {
            "gamma": gamma, "depth": depth, "seeds": len(rows), **{k: round(v, 4) for k, v in mean.items()},
            "best_inferential": round(sum(b["held_out_inferential"] for b in bests) / len(bests), 4),
            "best_symmetric": round(sum(b["held_out_symmetric"] for b in bests) / len(bests), 4),
            "init_std": None if d_model is None else round(d_model ** -gamma, 5),
            "verdict": classify_composite(mean["seen_accuracy"], mean["held_out_inferential"],
                                          mean["held_out_symmetric"]),
            "seed_verdicts": [r["verdict"] for r in rows],
        }
    return table


def sweep_phase_table(index: dict[str, Any], sweep_dir: Path | None = None, n: int = SCALES["cpu"].eval_samples
                      ) -> dict[str, dict[str, Any]]:
    """`aggregate_phase` over a composite sweep's index (sweep.json), from each cell's last
    evaluation (seen accuracy and held-out rates on the run's evaluation batch, about 140
    held-out sequences at eval_size 2,000), or with `sweep_dir` from `n` fresh test-key
    sequences per pair type (`composite_verdict`, the phase study's measure). Cells that did
    not finish are left out. Depth comes from the grid, else from the base config."""
    base = index["base"]["model"]
    points, measured = {}, {}
    for name, cell in index["cells"].items():
        final = cell.get("final") or {}
        if cell.get("status") != "done" or "acc_seen" not in final:
            continue
        points[name] = {"model.n_layers": base["n_layers"], "model.init_gamma": base["init_gamma"], **cell["point"]}
        if sweep_dir is not None:
            run = load_run(sweep_dir / name)
            measured[name] = composite_verdict(run.model, run.task, n=n).to_dict()
            continue
        rates = {"seen_accuracy": final["acc_seen"], "held_out_inferential": final["held_out_inferential"],
                 "held_out_symmetric": final["held_out_symmetric"]}
        measured[name] = {**rates, "verdict": classify_composite(*rates.values())}
    return aggregate_phase(points, measured, base["d_model"])


def sweep_cell_rows(index: dict[str, Any], sweep_dir: Path, n: int = SCALES["cpu"].eval_samples
                    ) -> dict[str, dict[str, Any]]:
    """Per finished cell of a composite sweep: its grid point, the init std of its gamma at its
    width, the steps it trained of its budget and why it stopped (the stop rule, the step budget,
    or "unfinished": killed or still training, its last checkpoint measured), and the
    verdict measured on `n` fresh sequences per pair type, test keys and training keys, and the
    held-out pair's most common answers that are neither solution."""
    rows = {}
    for name, cell in index["cells"].items():
        if cell.get("status") != "done":
            continue
        run = load_run(sweep_dir / name)
        cell = {"point": _point_of(run.config), **cell}
        verdict = composite_verdict(run.model, run.task, n=n).to_dict()
        last = run.metrics[-1] if run.metrics else {}
        gamma, width = run.config.model.init_gamma, run.config.model.d_model
        # the step of the weights measured: an unfinished run's last checkpoint, which may come
        # before its last evaluation
        step, budget = run.weights.step if run.weights else last.get("step"), run.config.train.steps
        rows[name] = {**cell["point"], "init_std": None if gamma is None else round(width ** -gamma, 5),
                      "steps": step, "of_steps": budget, "stopped": how_it_ended(last, step, budget),
                      **{k: verdict[k] for k in ("verdict", "seen_accuracy", "held_out_inferential",
                                                 "held_out_symmetric",
                                                 "held_out_by_key_position")},
                      **held_out_on_training_keys(run.model, run.task, n=n),
                      "held_out_other_answers": held_out_other_answers(run.model, run.task, n=n)}
    return rows


def _point_of(cfg: RunConfig) -> dict[str, Any]:
    """The settings a composite protocol ablation varies, read from a run's config: the point of
    a cell of a sweep still in progress (whose sweep.json, with the grid, is not written yet)."""
    return {"model.norm_position": cfg.model.norm_position, "train.lr": cfg.train.lr,
            "model.init_gamma": cfg.model.init_gamma, "model.n_layers": cfg.model.n_layers,
            "train.seed": cfg.train.seed}


def phase_figure(table: dict[str, dict[str, Any]]) -> plt.Figure:
    """Figure 2 of the paper: held-out inferential and symmetric rates over (gamma, depth), with
    seen-pair accuracy; each cell marked I / S / M / U by its verdict."""
    gammas = sorted({c["gamma"] for c in table.values()})
    depths = sorted({c["depth"] for c in table.values()})
    panels = [("held_out_inferential", "(4,3) inferential (x-10)"), ("held_out_symmetric", "(4,3) symmetric (x-6)"),
              ("seen_accuracy", "seen pairs, test keys")]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.2 * len(gammas) * 3, 1.5 + 0.5 * len(depths)))
    for ax, (key, title) in zip(axes, panels):
        grid = [[table[f"{g},{d}"][key] for g in gammas] for d in depths]
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, origin="lower", aspect="auto")
        ax.set(xticks=range(len(gammas)), xticklabels=gammas, yticks=range(len(depths)), yticklabels=depths,
               xlabel="initialisation rate gamma", ylabel="depth (layers)", title=title)
        for i, d in enumerate(depths):
            for j, g in enumerate(gammas):
                cell = table[f"{g},{d}"]
                ax.text(j, i, f"{VERDICT_MARK[cell['verdict']]}\n{cell[key]:.2f}", ha="center", va="center",
                        color="white" if cell[key] < 0.6 else "black", fontsize=8)
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8)
    return fig


def _by_position(measures: dict[str, Any], answer: str) -> str:
    """`.00 .00 ... .90`: a run's held-out rate of one answer per key position (the last position
    puts the anchor pair at the sequence's end)."""
    rates = (measures.get("held_out_by_key_position") or {}).get(answer) or []
    return " ".join("-" if r is None else f"{r:.2f}".lstrip("0") for r in rates)


def run_phase(ctx: StudyContext) -> dict[str, Any]:
    started = time.perf_counter()
    grid = with_seeds(scale_params(ctx.scale, ctx.protocol).phase_grid, ctx)
    base = base_config(ctx.scale, ctx.overrides, ctx.protocol)
    points, trained, measured = train_and_measure(ctx, base, grid)
    table = aggregate_phase(points, measured, base.model.d_model)
    verdicts = {key: cell["verdict"] for key, cell in table.items()}
    headline = {
        "verdicts (gamma,depth)": verdicts,
        "inferential_cells": sum(v == "inferential" for v in verdicts.values()),
        "symmetric_cells": sum(v == "symmetric" for v in verdicts.values()),
        "unlearned_cells": sum(v == "unlearned" for v in verdicts.values()),
        "failed_runs": sum(r.status == "failed" for r in trained.values()),
    }
    sections = [("Phase diagram", figure_html(phase_figure(table), "I inferential, S symmetric, M mixed, U unlearned "
                                                                  "(seen accuracy < 0.9); values are means over seeds")
               + table_html([[c["gamma"], c["init_std"], c["depth"], c["verdict"], " ".join(c["seed_verdicts"]),
                              c["seen_accuracy"], c["held_out_inferential"], c["held_out_symmetric"],
                              c["best_inferential"], c["best_symmetric"]] for c in table.values()],
                            ["gamma", "init std", "depth", "verdict", "per seed", "seen acc", "(4,3) x-10", "(4,3) x-6",
                             "best x-10 over lr", "best x-6 over lr"])),
                ("Every run: vectors and complexity", table_html(
        [[name, m.get("verdict"), m.get("seen_accuracy"), m.get("held_out_inferential"), m.get("held_out_symmetric"),
          _by_position(m, "inferential"), _by_position(m, "symmetric"),
          m.get("cosine_same_target"), m.get("cosine_different_target"),
          (m.get("query_condensation") or {}).get("share_aligned"), m.get("embedding_top1"), m.get("embedding_top3"),
          m.get("train_seconds")] for name, m in measured.items()],
        ["cell", "verdict", "seen", "x-10", "x-6", "x-10 per key position", "x-6 per key position", "cos same target",
         "cos other target", "W_Q aligned share", "emb top-1", "emb top-3", "train s"]))]
    return ctx.finish(f"composite-phase ({ctx.scale}): initialisation rate x depth", sections, {
        "headline": headline, "table": table, "cells": measured, "grid": grid,
        "base": base.to_dict(), "seconds": round(time.perf_counter() - started, 1)})


# ---------------------------------------------------------------------------------------------
# composite-lr-wd


def lr_wd_base(scale: str, overrides: Sequence[str] = (), protocol: str | None = None) -> RunConfig:
    """Depth 2 at gamma 0.5, where the paper (and our cpu phase diagram) finds symmetric
    solutions: can a larger learning rate or weight decay move it to inference?"""
    return with_model(base_config(scale, overrides, protocol), n_layers=2, init_gamma=0.5)


def run_lr_wd(ctx: StudyContext) -> dict[str, Any]:
    started = time.perf_counter()
    grid = with_seeds(scale_params(ctx.scale, ctx.protocol).lr_wd_grid, ctx)
    base = lr_wd_base(ctx.scale, ctx.overrides, ctx.protocol)
    points, _, measured = train_and_measure(ctx, base, grid)
    rows = [[points[n].get("train.lr"), points[n].get("train.weight_decay"), points[n].get("train.seed", 0),
             m.get("verdict"), m.get("seen_accuracy"), m.get("held_out_inferential"), m.get("held_out_symmetric"),
             m.get("cosine_same_target"), (m.get("query_condensation") or {}).get("share_aligned"),
             m.get("embedding_top1")] for n, m in measured.items()]
    sections = [("Cells", table_html(rows, ["lr", "weight decay", "seed", "verdict", "seen", "(4,3) x-10", "(4,3) x-6",
                                            "cos same target", "W_Q aligned share", "emb top-1"]))]
    headline = {n: {"verdict": m.get("verdict"), "x-10": m.get("held_out_inferential"),
                    "x-6": m.get("held_out_symmetric")}
                for n, m in measured.items()}
    return ctx.finish(f"composite-lr-wd ({ctx.scale}): learning rate x weight decay, depth 2, gamma 0.5", sections, {
        "headline": headline, "cells": measured, "grid": grid, "base": base.to_dict(),
        "seconds": round(time.perf_counter() - started, 1)})


STUDIES = [
    Study("composite-phase", "composite: verdict per (init rate gamma, depth), the paper's Figure 2", run_phase,
          base_config=base_config, protocols=PROTOCOLS),
    Study("composite-mechanism", "composite: small vs large gamma 2-layer models: attention, patching, probes, "
                                 "vectors, complexity (Figures 3-5)", run_mechanism, base_config=base_config,
          takes_gammas=True, protocols=PROTOCOLS),
    Study("composite-lr-wd", "composite: learning rate x weight decay push toward inference (finding 5)", run_lr_wd,
          base_config=base_config, protocols=PROTOCOLS),
]


def _parser(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--measure", action="store_true",
                        help="measure every finished cell on fresh test-key sequences (--n per pair type), as the "
                             "phase study does, instead of reading its last evaluation")
    parser.add_argument("--n", type=int, default=None,
                        help="with --measure or --cells: sequences per pair type (default "
                             f"{SCALES['cpu'].eval_samples:,}, "
                             f"the cpu scale's; gpu {SCALES['gpu'].eval_samples:,}); with --mechanism, sequences per "
                             "measure (default 256)")
    parser.add_argument("--cells", action="store_true",
                        help="one line per finished cell instead of the phase protocol's (gamma, depth) table: its "
                             "grid point, steps trained, why it stopped, and the verdict on fresh test-key and "
                             "training-key sequences (--n per pair type); SWEEP_DIR may also be a plain "
                             "folder of run folders")
    parser.add_argument("--mechanism", action="store_true",
                        help="with --cells: per cell, the mechanism at key position 2 and at the last one (6: the "
                             "pair ends the sequence) instead of the verdict: held-out answers, attention flow, "
                             "residual patching")
    parser.add_argument("--complexity", action="store_true",
                        help="with --cells: per cell, the verdict with the vectors and complexity measures of the "
                             "phase study's report (last-token cosines for equal and other targets, first-layer W_Q "
                             "condensation, the value embeddings' leading eigenvalue shares)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m analyses.studies.composite SWEEP_DIR`: the phase protocol's table of a
    composite sweep (`workbench sweep --preset composite-cpu --grid train.seed=... train.lr=...
    model.init_gamma=...`): per (gamma, depth) the verdict of the seeds' best learning rates."""
    import json
    import sys

    parser = _parser(main.__doc__.split("\n")[0])
    args = parser.parse_args(argv)
    if args.mechanism and not args.cells:
        parser.error("--mechanism reads cells one by one; add --cells")
    if args.complexity and (not args.cells or args.mechanism):
        parser.error("--complexity reads cells one by one: add --cells (and leave out --mechanism)")
    finished, in_progress = args.sweep_dir / "sweep.json", args.sweep_dir / "cells.json"
    if args.cells and not finished.exists() and in_progress.exists():  # the cells a sweep has finished so far
        index = {"cells": read_json(in_progress)}
    elif args.cells and not finished.exists():  # a folder of run folders (e.g. analyses/gpu/composite_paper.sh's)
        index = {"cells": {run.name: {"status": "done"} for run in run_folders(args.sweep_dir)}}
        if not index["cells"]:
            print(f"error: {args.sweep_dir} holds no sweep (sweep.json, cells.json) and no run folder "
                  "(config.json with model.safetensors)", file=sys.stderr)
            return 2
    else:
        index = read_json(finished)
    if args.cells and args.mechanism:
        for name, cell in index["cells"].items():
            if cell.get("status") == "done":
                by_position = mechanism_by_key_position(load_run(args.sweep_dir / name), n=args.n or 256)
                print(json.dumps({"cell": name, "by_key_position": by_position}))
        return 0
    n = args.n or SCALES["cpu"].eval_samples
    if args.cells and args.complexity:
        for name, cell in index["cells"].items():
            if cell.get("status") == "done":
                print(json.dumps({"cell": name, **complexity_row(load_run(args.sweep_dir / name), n)}))
        return 0
    if args.cells:
        for name, row in sweep_cell_rows(index, args.sweep_dir, n).items():
            print(json.dumps({"cell": name, **row}))
        return 0
    table = sweep_phase_table(index, args.sweep_dir if args.measure else None, n)
    for cell in table.values():
        print(json.dumps(cell))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
