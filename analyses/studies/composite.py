"""Composite-function studies (PAPERS.md section 2): does the initialisation scale decide
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

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from analyses.runners.study import Scales, Study, StudyContext, how_it_ended, run_folders
from analyses.runners.sweep import CellResult, grid_cells, grid_points
from interp.analysis import predictions
from interp.complexity import embedding_spectrum, leading_share, query_condensation
from interp.patching import logit_diff_metric, patch_residual
from interp.report import figure_html, table_html
from interp.tasks.composite import (
    _held_out_pairs,
    anchor_order_sensitivity,
    classify_composite,
    composite_attention_flow,
    composite_probe_map,
    composite_verdict,
    held_out_on_training_keys,
    held_out_other_answers,
    pair_route_at_last,
)
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import get_preset
from models.runs import LoadedRun, load_run, read_json
from models.train import fastest_cpu_options
from tasks import CompositeConfig, CompositeTask, ConfigError, seeded_generator

SEEN_LEARNED = 0.9  # the paper counts a run whose seen-pair accuracy is below this as unlearned
VERDICT_MARK = {"inferential": "I", "symmetric": "S", "mixed": "M", "unlearned": "U"}


@dataclass(frozen=True)
class CompositeScale:
    """What one scale of the composite studies trains and measures. `base`: the config every cell
    starts from, before the study's `--set`; `phase_grid`: composite-phase's grid, seed first
    (slowest) so that a run cut short has whole diagrams for the first seeds; `contrast_gammas`:
    composite-mechanism's small and large gamma; `lr_wd_grid`: composite-lr-wd's grid (one seed
    unless it says otherwise; `--seeds` adds more); `eval_samples`: fresh sequences per pair type
    for each cell's verdict."""

    base: Callable[[], RunConfig]
    phase_grid: dict[str, list[Any]]
    contrast_gammas: tuple[float, float]
    lr_wd_grid: dict[str, list[Any]]
    eval_samples: int


def _tiny_base() -> RunConfig:
    return RunConfig(task=CompositeConfig(),
                     model=ModelConfig(n_layers=2, d_model=32, n_heads=1, d_mlp=64, init_gamma=0.5),
                     train=TrainConfig(steps=10, batch_size=32, warmup_steps=2, eval_every=5, eval_size=64,
                                       checkpoint_every=10))


def _cpu_base() -> RunConfig:
    """The composite-cpu preset trained to the stop rule (seen-pair accuracy no higher over 5
    evaluations of 100 steps; at most 3,000 steps), compiled where a C++ compiler is at hand, with
    bf16 autocast where the CPU has bf16 kernels (about 3x the eager fp32 steps/s at depth 2,
    analyses/RESULTS.md). So the cells' configs depend on the machine: a study folder resumed on a
    machine with other options refuses its finished cells as another config; `--set
    train.precision=... --set train.compile=...` matches them."""
    cpu = get_preset("composite-cpu")
    return dataclasses.replace(cpu, train=dataclasses.replace(cpu.train, steps=3000, plateau_evals=5,
                                                              **fastest_cpu_options()))


def _matched_tiny_base() -> RunConfig:
    return _tiny_base().with_overrides(["model.biases=false", "model.act_fn=relu", "task.key_modulus=9",
                                        "train.lr=1e-4"])


def _matched_cpu_base() -> RunConfig:
    """The composite-matched preset (pre-LN, bias-free ReLU, test keys x mod 9, lr 1e-4, a stop rule
    that waits for the held-out answers, at most 30,000 steps), compiled where a C++ compiler is at
    hand. Always fp32, as every run of its recorded diagram: bf16 would be another protocol."""
    matched = get_preset("composite-matched")
    return dataclasses.replace(matched, train=dataclasses.replace(matched.train, precision="fp32",
                                                                  compile=fastest_cpu_options()["compile"]))


SCALES = Scales(
    CompositeScale,
    tiny=CompositeScale(_tiny_base, phase_grid={"train.seed": [0], "model.init_gamma": [0.3, 0.9], "model.n_layers": [1]},
                        contrast_gammas=(0.3, 0.9),
                        lr_wd_grid={"train.lr": [1e-3, 3e-3], "train.weight_decay": [0.01, 1.0]}, eval_samples=200),
    # phase: the paper's gammas and 0.9 at depth 2-5, 3 seeds and one learning rate (1e-3), to fit 60
    # minutes of 2 cores (the paper: 3 seeds x 9 learning rates; at depth 2 the pre-LN verdicts of gamma
    # 0.5 and 0.7 did not depend on the lr over 5e-4..2e-3, but gamma 0.8's did, analyses/RESULTS.md).
    # Contrast: 0.5 vs 0.7, the symmetric and inferential depth-2 cells of the pre-LN cpu phase diagram,
    # whose gamma 0.9 cells answered symmetrically
    cpu=CompositeScale(_cpu_base, phase_grid={"train.seed": [0, 1, 2],
                                              "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                                              "model.n_layers": [2, 3, 4, 5]},
                       contrast_gammas=(0.5, 0.7),
                       lr_wd_grid={"train.lr": [1e-3, 3e-3], "train.weight_decay": [0.01, 1.0]}, eval_samples=2000),
    # the composite-gpu preset (the paper's width and post-LN block, batch 2048, fresh data, to the stop
    # rule or 6,000 steps). Phase: the paper's gammas (0.3-0.8; at its width 400, gamma 0.9 is std
    # 0.0045) at depth 2-5, one learning rate. Contrast: the paper's gammas, at its width. lr x wd: the
    # paper's peak lr 2.5e-4, the preset's 5e-4 and twice that, times the paper's weight decays
    gpu=CompositeScale(partial(get_preset, "composite-gpu"),
                       phase_grid={"train.seed": [0, 1], "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                                   "model.n_layers": [2, 3, 4, 5]},
                       contrast_gammas=(0.5, 0.8),
                       lr_wd_grid={"train.lr": [2.5e-4, 5e-4, 1e-3], "train.weight_decay": [0.0, 0.01, 0.1, 1.0]},
                       eval_samples=5000),
    # phase: 3 seeds x 9 learning rates uniformly in [1e-4, 3e-4] per cell (PAPERS.md section 2)
    paper=CompositeScale(partial(get_preset, "composite-paper"),
                         phase_grid={"train.seed": [0, 1, 2], "train.lr": [round(1e-4 + i * 2.5e-5, 7) for i in range(9)],
                                     "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8], "model.n_layers": [2, 3, 4, 5, 6]},
                         contrast_gammas=(0.5, 0.8),
                         lr_wd_grid={"train.seed": [0, 1, 2], "train.lr": [1e-4, 2e-4, 3e-4, 5e-4],
                                     "train.weight_decay": [0.0, 0.01, 0.1, 1.0]},
                         eval_samples=5000),
)


# `--protocol matched`: the protocol nearest the paper's that gave both of its depth-2 corners on cpu
# (analyses/RESULTS.md, issue 27). Phase: the gammas around the corners (0.5 large init .. 1.0, std
# .088 .. .008 at width 128) at depth 2-4, 2 seeds: 24 runs of 11-49 minutes of one core each (measured
# beside other training), 11 hours of one core in all: 5-6 hours with --workers 2.
# Contrast: 0.5 vs 0.9, the symmetric and inferential depth-2 models of that protocol. lr x wd: its
# lr 1e-4 and the two larger ones it was measured at, times the weight decay of finding 5. Only the
# tiny and cpu scales: the gpu and paper scales train presets at the paper's width (composite-paper: its
# whole recipe).
MATCHED = {
    "tiny": CompositeScale(_matched_tiny_base, phase_grid=SCALES["tiny"].phase_grid, contrast_gammas=(0.5, 0.9),
                           lr_wd_grid=SCALES["tiny"].lr_wd_grid, eval_samples=200),
    "cpu": CompositeScale(_matched_cpu_base, phase_grid={"train.seed": [0, 1], "model.init_gamma": [0.5, 0.7, 0.9, 1.0],
                                                         "model.n_layers": [2, 3, 4]},
                          contrast_gammas=(0.5, 0.9),
                          lr_wd_grid={"train.lr": [1e-4, 3e-4, 1e-3], "train.weight_decay": [0.01, 1.0]},
                          eval_samples=2000),
}
PROTOCOLS = ("fast", "matched")  # `--protocol`; the first is the default


def scale_params(scale: str, protocol: str | None = None) -> CompositeScale:
    """What `scale` trains and measures under `protocol` ("fast", the default: SCALES; "matched":
    MATCHED)."""
    if protocol in (None, "fast"):
        return SCALES[scale]
    if protocol != "matched":
        raise ConfigError(f"--protocol {protocol!r} is unknown; use one of {PROTOCOLS}")
    if scale not in MATCHED:
        raise ConfigError(f"--protocol matched is a width-128 cpu protocol, declared at scales {tuple(MATCHED)}; at scale "
                          f"{scale!r} the study trains its own preset (composite-gpu: the paper's width and block; "
                          f"composite-paper: the paper's whole recipe), so leave --protocol out")
    return MATCHED[scale]


def base_config(scale: str, overrides: Sequence[str] = (), protocol: str | None = None) -> RunConfig:
    """The config every cell of `scale` starts from under `protocol`, with the study's `--set`
    overrides (e.g. model.norm_position=post)."""
    return scale_params(scale, protocol).base().with_overrides(list(overrides))


def with_seeds(grid: dict[str, list[Any]], ctx: StudyContext) -> dict[str, list[Any]]:
    """A copy of `grid` (a scale's, which stays as declared), with the caller's `--seeds` as its
    first (slowest) axis when given."""
    if not ctx.seeds:
        return {key: list(values) for key, values in grid.items()}
    return {"train.seed": list(ctx.seeds), **{k: list(v) for k, v in grid.items() if k != "train.seed"}}


def contrast_gammas(scale: str, chosen: tuple[float, float] | None = None, protocol: str | None = None
                    ) -> dict[str, float]:
    """The gammas of the mechanism study's two models: `chosen` (`--gammas SMALL,LARGE`), else
    the scale's under `protocol`."""
    small, large = chosen if chosen is not None else scale_params(scale, protocol).contrast_gammas
    return {"small_gamma": small, "large_gamma": large}


def with_model(cfg: RunConfig, **changes: Any) -> RunConfig:
    """`cfg` with its model section changed (validated like any other config)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **changes))


# ---------------------------------------------------------------------------------------------
# Per-cell measurements


def cell_measures(run: LoadedRun, n: int, seed: int = 0) -> dict[str, Any]:
    """Verdict, held-out rates, last-token cosines, query condensation and embedding spectrum."""
    verdict = composite_verdict(run.model, run.task, n=n, seed=seed)
    task: CompositeTask = run.task
    values = list(range(task.cfg.value_min, task.cfg.value_max + 1))
    spectrum = embedding_spectrum(run.model.W_E, values)
    return {
        **{k: v for k, v in verdict.to_dict().items() if k != "attention_flow"},
        **held_out_on_training_keys(run.model, task, n=n, seed=seed),
        "attention_flow": verdict.attention_flow,
        "query_condensation": query_condensation(run.model, 0).to_dict(),
        "embedding_top1": round(leading_share(spectrum, 1), 4), "embedding_top3": round(leading_share(spectrum, 3), 4),
        "embedding_spectrum": [round(x, 4) for x in spectrum[:8].tolist()],
    }


COMPLEXITY_KEYS = ("verdict", "seen_accuracy", "held_out_inferential", "held_out_symmetric", "cosine_same_target",
                   "cosine_different_target", "embedding_top1", "embedding_top3")


def complexity_row(run: LoadedRun, n: int) -> dict[str, Any]:
    """The phase study's per-run vectors and complexity columns (`cell_measures`) of one run, with
    its gamma, depth, width and step: what `--cells --complexity` prints."""
    measures = cell_measures(run, n)
    condensation = measures["query_condensation"]
    return {"init_gamma": run.config.model.init_gamma, "n_layers": run.config.model.n_layers,
            "d_model": run.config.model.d_model, "step": run.weights.step if run.weights else None,
            **{k: measures[k] for k in COMPLEXITY_KEYS}, "wq_share_aligned": condensation["share_aligned"],
            "wq_mean_abs_cosine": condensation["mean_abs_cosine"], "wq_random_baseline": condensation["random_baseline"]}


def train_and_measure(ctx: StudyContext, base: RunConfig, grid: dict[str, list[Any]]
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, CellResult], dict[str, dict[str, Any]]]:
    """The cell loop of the grid studies (phase, lr-wd): every combination of `grid` on `base`,
    trained (or found finished) under runs/, then measured. Returns each cell's grid point, its
    training result and its measures, by cell name."""
    cells = grid_cells(base, grid)
    points = dict(zip(cells, grid_points(grid)))
    trained = ctx.run_cells(cells, "runs")
    return points, trained, _measure_cells(ctx, trained, "runs")


def _measure_cells(ctx: StudyContext, results: dict[str, CellResult], subdir: str) -> dict[str, dict[str, Any]]:
    """Measures of every cell that trained; failed and diverged cells get only their status."""
    measured = {}
    for name, result in results.items():
        if result.status != "done":
            measured[name] = {"status": result.status, "verdict": "unlearned" if result.status == "diverged" else "failed"}
            continue
        run = load_run(ctx.out / subdir / name)
        measured[name] = {"status": "done", "train_seconds": round(result.seconds, 1),
                          **cell_measures(run, scale_params(ctx.scale, ctx.protocol).eval_samples)}
    return measured


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
            "verdict": classify_composite(mean["seen_accuracy"], mean["held_out_inferential"], mean["held_out_symmetric"]),
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
                      **{k: verdict[k] for k in ("verdict", "seen_accuracy", "held_out_inferential", "held_out_symmetric",
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
                              c["seen_accuracy"], c["held_out_inferential"], c["held_out_symmetric"], c["best_inferential"],
                              c["best_symmetric"]] for c in table.values()],
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
# composite-mechanism


def patching_at_sites(run: LoadedRun, change: str, n: int = 256, key_pos: int = 2, seed: int = 0) -> dict[str, Any]:
    """Residual-stream patching (clean into corrupted) per layer at the key, anchor 1, anchor 2
    and last positions, for a corruption of the key or of one anchor (seen pairs, training keys,
    the key at `key_pos` so positions line up)."""
    task: CompositeTask = run.task
    gen = seeded_generator(seed)
    clean = task.sample(n, gen, split="train", key_pos=key_pos)
    corrupted, changed = task.corrupt(clean, gen, change=change)
    keep = changed[:, 0]
    clean, corrupted = clean.select(keep), corrupted.select(keep)
    result = patch_residual(run.model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted))
    sites = {"key": key_pos, "anchor1": key_pos + 1, "anchor2": key_pos + 2, "last": task.cfg.seq_len - 1}
    return {site: [round(v, 3) for v in result.values[:, pos].tolist()] for site, pos in sites.items()}


def mechanism_by_key_position(run: LoadedRun, key_positions: Sequence[int] | None = None, n: int = 256,
                              seed: int = 0) -> dict[int, dict[str, Any]]:
    """The mechanism where the pair sits: per key position, the held-out pair's answers and
    attention flow (test keys at that position) and residual patching for a corrupted key or
    anchor 1 (`patching_at_sites`), whether the anchors' order survives to each layer
    (`anchor_order_sensitivity`) and which layer's attention carries the pair to the last token
    (`pair_route_at_last`). With the key at the last position it can take (seq_len - 3), the pair
    ends the sequence and anchor 2 is the last token. Default positions: 2 and that last one (6
    at seq_len 9)."""
    task: CompositeTask = run.task
    if key_positions is None:
        key_positions = (min(2, task.n_key_positions - 1), task.n_key_positions - 1)
    out = {}
    for key_pos in key_positions:
        if not 0 <= key_pos < task.n_key_positions:
            raise ValueError(f"key position {key_pos} is outside 0..{task.n_key_positions - 1}")
        gen = seeded_generator(seed)
        held = task.sample(n, gen, split="test", pair_ids=_held_out_pairs(task, n, gen), key_pos=key_pos)
        answer = predictions(run.model, held)[:, 0]
        out[key_pos] = {
            "held_out_inferential": round((answer == held.latents["inferential"]).float().mean().item(), 3),
            "held_out_symmetric": round((answer == held.latents["symmetric"]).float().mean().item(), 3),
            "attention": composite_attention_flow(run.model, held),
            "patching_key": patching_at_sites(run, "key", n=n, key_pos=key_pos, seed=seed),
            "patching_anchor1": patching_at_sites(run, "anchor1", n=n, key_pos=key_pos, seed=seed),
            "order_swapped": anchor_order_sensitivity(run.model, task, key_pos, n=n, seed=seed),
            "pair_route_at_last": pair_route_at_last(run.model, task, key_pos, n=n, seed=seed),
        }
    return out


def mechanism_measures(run: LoadedRun, scale: str, protocol: str | None = None) -> dict[str, Any]:
    n = scale_params(scale, protocol).eval_samples
    probes = composite_probe_map(run.model, run.task, n_train=max(400, n * 2), n_test=n)
    probe_table = {f"{site}:{quantity}": [round(v, 3) for v in probes.at(site, quantity).tolist()]
                   for site in probes.site_names for quantity in probes.quantity_names}
    return {
        **cell_measures(run, n),
        "patching_key": patching_at_sites(run, "key", n=min(256, n)),
        "patching_anchor1": patching_at_sites(run, "anchor1", n=min(256, n)),
        "probes": probe_table, "probe_layers": probes.layer_names,
    }


def contrast_cells(scale: str, overrides: Sequence[str] = (), gammas: tuple[float, float] | None = None,
                   protocol: str | None = None, seeds: Sequence[int] = (0,)) -> dict[str, RunConfig]:
    """The mechanism study's 2-layer models at the contrast gammas (`gammas`, else the scale's),
    on the base config of `protocol` with the study's `--set` overrides: a pair per seed (`--seeds`;
    default seed 0), named small_gamma and large_gamma, with -s<seed> after them for other seeds."""
    base = with_model(base_config(scale, overrides, protocol), n_layers=2)
    cells = {}
    for seed in seeds:
        seeded = dataclasses.replace(base, train=dataclasses.replace(base.train, seed=seed))
        for name, gamma in contrast_gammas(scale, gammas, protocol).items():
            cells[name if seed == 0 else f"{name}-s{seed}"] = with_model(seeded, init_gamma=gamma)
    return cells


def _flow_rows(measures: dict[str, dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for name, m in measures.items():
        for key, per_layer in m.get("attention_flow", {}).items():
            rows.append([name, f"attention {key}", *per_layer])
        for change in ("key", "anchor1"):
            for site, per_layer in m.get(f"patching_{change}", {}).items():
                rows.append([name, f"patch resid at {site} ({change} corrupted)", *per_layer])
    return rows


def flow_figure(measures: dict[str, dict[str, Any]]):
    """The paper's Figure 3 as heatmaps: per model, every attention and patching measure (rows)
    per layer (columns), values written in the cells."""
    import matplotlib.pyplot as plt

    models = {name: _flow_rows({name: m}) for name, m in measures.items() if m.get("attention_flow")}
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(5.2 * max(1, len(models)), 4.8), squeeze=False)
    for ax, (name, rows) in zip(axes[0], models.items()):
        values = [[float(v) for v in row[2:]] for row in rows]
        ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set(title=name, xlabel="layer",
               xticks=range(len(values[0])), yticks=range(len(rows)))
        ax.set_yticklabels([row[1] for row in rows], fontsize=7)
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.5 else "black")
    fig.tight_layout()
    return fig


def run_mechanism(ctx: StudyContext) -> dict[str, Any]:
    started = time.perf_counter()
    cells = contrast_cells(ctx.scale, ctx.overrides, ctx.gammas, ctx.protocol, ctx.seeds_or([0]))
    trained = ctx.run_cells(cells, "runs")
    measures = {name: ({"status": r.status} if r.status != "done"
                       else mechanism_measures(load_run(ctx.out / "runs" / name), ctx.scale, ctx.protocol))
                for name, r in trained.items()}
    n_layers = 2
    summary_keys = ["verdict", "seen_accuracy", "held_out_inferential", "held_out_symmetric", "cosine_same_target",
                    "cosine_different_target", "embedding_top1", "embedding_top3"]
    sections = [("Models", table_html([[name, cells[name].model.init_gamma, cells[name].train.seed,
                                       *(m.get(k) for k in summary_keys), (m.get("query_condensation") or {}).get("share_aligned")]
                                      for name, m in measures.items()],
                                     ["model", "gamma", "seed", *summary_keys, "W_Q aligned share"])),
                ("Information flow per layer (attention, head-averaged; patching: 0 corrupted .. 1 clean)",
               figure_html(flow_figure(measures), "Attention from the last token to key and anchors and from the "
                           "anchors to the key, and residual patching at each site, per layer (Figure 3).")
               + table_html(_flow_rows(measures), ["model", "measure", *[f"layer {i}" for i in range(n_layers)]]))]
    probe_rows = [[name, key, *values] for name, m in measures.items() for key, values in m.get("probes", {}).items()]
    sections.append(("Probes (LDA, accuracy per residual stream; site:quantity)",
                     table_html(probe_rows, ["model", "site:quantity", *next(
                         (m["probe_layers"] for m in measures.values() if "probe_layers" in m), [])])))
    headline = {name: {k: m.get(k) for k in ("verdict", "held_out_inferential", "held_out_symmetric",
                                             "cosine_same_target")} for name, m in measures.items()}
    return ctx.finish(f"composite-mechanism ({ctx.scale}): small vs large initialisation rate, 2 layers", sections, {
        "headline": headline, "models": measures, "gammas": contrast_gammas(ctx.scale, ctx.gammas, ctx.protocol),
        "seconds": round(time.perf_counter() - started, 1)})


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
    headline = {n: {"verdict": m.get("verdict"), "x-10": m.get("held_out_inferential"), "x-6": m.get("held_out_symmetric")}
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


def main(argv: list[str] | None = None) -> int:
    """`python -m analyses.studies.composite SWEEP_DIR`: the phase protocol's table of a
    composite sweep (`workbench sweep --preset composite-cpu --grid train.seed=... train.lr=...
    model.init_gamma=...`): per (gamma, depth) the verdict of the seeds' best learning rates."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--measure", action="store_true",
                        help="measure every finished cell on fresh test-key sequences (--n per pair type), as the phase "
                             "study does, instead of reading its last evaluation")
    parser.add_argument("--n", type=int, default=None,
                        help=f"with --measure or --cells: sequences per pair type (default {SCALES['cpu'].eval_samples:,}, "
                             f"the cpu scale's; gpu {SCALES['gpu'].eval_samples:,}); with --mechanism, sequences per "
                             "measure (default 256)")
    parser.add_argument("--cells", action="store_true",
                        help="one line per finished cell instead of the phase protocol's (gamma, depth) table: its grid "
                             "point, steps trained, why it stopped, and the verdict on fresh test-key and training-key "
                             "sequences (--n per pair type); SWEEP_DIR may also be a plain folder of run folders")
    parser.add_argument("--mechanism", action="store_true",
                        help="with --cells: per cell, the mechanism at key position 2 and at the last one (6: the "
                             "pair ends the sequence) instead of the verdict: held-out answers, attention flow, "
                             "residual patching")
    parser.add_argument("--complexity", action="store_true",
                        help="with --cells: per cell, the verdict with the vectors and complexity measures of the phase "
                             "study's report (last-token cosines for equal and other targets, first-layer W_Q "
                             "condensation, the value embeddings' leading eigenvalue shares)")
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
