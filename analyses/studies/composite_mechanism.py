"""composite-mechanism (a study of composite.py's STUDIES): a small-gamma and a large-gamma 2-layer
model side by side: attention flow, residual patching at the key and anchor positions per layer,
probes for key, intermediate and target (Figure 3); last-token cosine similarity for equal
targets, query condensation and the embedding spectrum (Figures 4-5)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt

from analyses.runners.study import StudyContext
from analyses.studies.composite_cells import base_config, cell_measures, contrast_gammas, scale_params, with_model
from interp.patching import logit_diff_metric, patch_residual
from interp.report import figure_html, table_html
from interp.task_analysis import predictions
from interp.tasks.composite import (
    anchor_order_sensitivity,
    composite_attention_flow,
    composite_probe_map,
    held_out_pairs,
    pair_route_at_last,
)
from models.config import RunConfig
from models.runs import LoadedRun, load_run
from tasks import CompositeTask, seeded_generator

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
        held = task.sample(n, gen, split="test", pair_ids=held_out_pairs(task, n, gen), key_pos=key_pos)
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
                                       *(m.get(k) for k in summary_keys),
                                       (m.get("query_condensation") or {}).get("share_aligned")]
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
