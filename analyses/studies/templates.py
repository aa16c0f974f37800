"""Template-task studies (docs/papers.md, section 3): can a transformer reason with symbols it never saw
in training, how many training symbols does it need, and does identity-augmented attention
(a_h X X^T in the scores, b_h A_h X in the output) cut that number?

- templates-efficiency: test loss and error on unseen symbols vs training alphabet size n
  (powers of two), plain vs augmented, over seeds (the paper's data-efficiency curves), and the
  factor by which the augmented model needs fewer symbols for a given test loss.
- templates-copy-width: the copy template (`a = q ; print a -> q`); per width d_model, the
  smallest n with test error < 0.05, plain vs augmented.
- templates-mlp-control: the paper's MLP control of finding 1: a plain MLP over the
  concatenated token embeddings (models/mlp_control.py) on the templates-efficiency cells' data
  stream, schedule and test batch, per n and seed; once with the transformer's own frozen random
  embeddings, once with one-hot symbols (the paper's inputs).
- templates-heads: augmented (and plain) models on same-different and binding: head scores
  (does a head attend to the repeat of its symbol?), the learned a_h, b_h, per-layer and per-head
  patching, and how much accuracy is lost when the identity terms are switched off.

Every model keeps its token embeddings fixed at their random init and reads logits with them
(model.fixed_embeddings), so unseen symbols are statistically like seen ones on the way in and out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch

from analyses.runners.study import Cell, Scales, Study, StudyContext, how_it_ended, run_folders
from interp.attention import classify_heads
from interp.patching import activation_patch, logit_diff_metric, patch_head_out
from interp.report import figure_html, table_html
from models.config import ModelConfig, RunConfig, TrainConfig
from models.mlp_control import train_mlp_control
from models.runs import load_run
from tasks import TemplatesConfig, logits_at_labels, seeded_generator

VARIANTS = {"plain": False, "augmented": True}
ERROR_TARGET = 0.05  # copy-vs-width: "learned" means test error below this (the paper's criterion)

@dataclass(frozen=True)
class TemplatesScale:
    """What one scale of the templates studies trains. `ns`: training alphabet sizes of
    templates-efficiency; `width_ns` and `widths`: those of templates-copy-width, per model
    width; `d_model`: the width elsewhere; `heads_n`: the alphabet of templates-heads; `n_test`:
    test symbols; `eval`: evaluation samples (and templates-heads' analysis samples); `device`
    and `precision` where not TrainConfig's defaults."""

    ns: tuple[int, ...]
    width_ns: tuple[int, ...]
    seeds: tuple[int, ...]
    widths: tuple[int, ...]
    d_model: int
    steps: int
    batch: int
    eval: int
    n_test: int
    heads_n: int
    device: str = "auto"
    precision: str = "fp32"


SCALES = Scales(
    TemplatesScale,
    tiny=TemplatesScale(ns=(4, 8), width_ns=(4, 8), seeds=(0,), widths=(16,), d_model=16, steps=10, batch=16, eval=32,
                        n_test=32, heads_n=8),
    # width_ns coarser than ns: the widest copy-width cells cost ~4x more
    cpu=TemplatesScale(ns=(4, 8, 16, 32, 64, 128, 256, 512, 1024), width_ns=(4, 16, 64, 256, 1024), seeds=(0, 1, 2),
                       widths=(32, 64, 128), d_model=64, steps=600, batch=256, eval=1000, n_test=512, heads_n=256),
    # one GPU (CUDA, bf16): the paper's alphabets, narrower models and a quarter of its steps. By FLOP
    # count, an estimate: at most 0.16 TFLOP per step (copy, d 512, n 4096), 0.8 PFLOP a model, seconds
    # of an H100; 5,000 steps of so small a model are bound by kernel launches, a minute or two
    gpu=TemplatesScale(ns=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096), width_ns=(16, 64, 256, 1024, 4096),
                       seeds=(0, 1, 2), widths=(64, 128, 256, 512), d_model=256, steps=5000, batch=512, eval=5000,
                       n_test=2048, heads_n=1024, device="cuda", precision="bf16"),
    paper=TemplatesScale(ns=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                         width_ns=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096), seeds=(0, 1, 2, 3, 4),
                         widths=(64, 128, 256, 512, 1024, 4096), d_model=512, steps=20_000, batch=512, eval=5000,
                         n_test=4096, heads_n=1024),
)


def cell_config(scale: str, template: str, n: int, augmented: bool, seed: int = 0, d_model: int | None = None,
                n_vars: int = 2) -> RunConfig:
    """One training run: a 2-layer, 4-head model on `template` with n training symbols."""
    s = SCALES[scale]
    d = d_model or s.d_model
    return RunConfig(
        task=TemplatesConfig(template=template, n_train_symbols=n, n_val_symbols=max(16, 2 * n_vars),
                             n_test_symbols=s.n_test, n_vars=n_vars),
        model=ModelConfig(n_layers=2, d_model=d, n_heads=4, identity_attention=augmented, fixed_embeddings=True),
        train=TrainConfig(steps=s.steps, batch_size=s.batch, lr=3e-3, warmup_steps=min(50, s.steps // 5),
                          eval_every=max(1, s.steps // 4), eval_size=s.eval, checkpoint_every=s.steps,
                          seed=seed, device=s.device, precision=s.precision),
    )


def smallest_n_below_target(errors: dict[int, float | None]) -> int | None:
    """The smallest alphabet size whose test error is below ERROR_TARGET (None, or NaN: not
    measured); None when no n reaches it."""
    return min((n for n, error in errors.items() if error is not None and error < ERROR_TARGET), default=None)


def _final(results: dict, name: str) -> dict[str, Any]:
    cell = results[name]
    return cell.final if cell.status == "done" else {}


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


# ---------------------------------------------------------------------------------------------
# templates-efficiency


def run_efficiency(ctx: StudyContext) -> dict[str, Any]:
    s, started = SCALES[ctx.scale], time.perf_counter()
    seeds = ctx.seeds_or(s.seeds)
    template = "same_different"
    cells = {Cell(v, seed, (f"n{n}",)): cell_config(ctx.scale, template, n, aug, seed)
             for seed in seeds for v, aug in VARIANTS.items() for n in s.ns}
    results = ctx.run_cells(cells)

    def final(v: str, n: int, seed: int) -> dict[str, Any]:
        return _final(results, Cell(v, seed, (f"n{n}",)).name)

    curves = {v: {n: {k: _mean_std([float(final(v, n, seed).get(k, math.nan)) for seed in seeds if final(v, n, seed)])
                      for k in ("eval_loss", "error")}
                  for n in s.ns} for v in VARIANTS}
    factors = data_factors({v: {n: c[n]["eval_loss"][0] for n in c} for v, c in curves.items()})
    headline = {"template": template, "factor_at_plain_best": factors[-1]["factor"] if factors else None,
                "plain_loss_at_max_n": curves["plain"][s.ns[-1]]["eval_loss"][0],
                "augmented_loss_at_max_n": curves["augmented"][s.ns[-1]]["eval_loss"][0]}
    out = {"headline": headline, "curves": _jsonable(curves), "factors": factors, "seeds": seeds,
           "cells": {k: r.to_dict() for k, r in results.items()}, "seconds": round(time.perf_counter() - started, 1)}
    sections = [
        ("Test loss on unseen symbols vs training alphabet size",
         figure_html(_curve_figure(curves, s.ns), "mean +- std over seeds; test symbols never seen in training")
         + table_html(_curve_rows(curves, s.ns), ["n", "variant", "test loss", "test error"])),
        ("Training symbols needed for a given test loss",
         table_html([[f"{f['loss']:.4f}", f["n_plain"], f["n_augmented"], f["factor"]] for f in factors],
                    ["test loss <=", "n plain", "n augmented", "factor plain / augmented"])),
    ]
    return ctx.finish(f"templates-efficiency ({ctx.scale})", sections, out)


def data_factors(losses: dict[str, dict[int, float]]) -> list[dict[str, Any]]:
    """For each test loss the plain model reaches (its mean at each n), the smallest n at which
    each variant reaches it and the ratio n_plain / n_augmented (None when one never does)."""
    rows = []
    # compare with the exact means: a target rounded first can fall just below the plain point it came from
    for target in sorted({v for v in losses["plain"].values() if not math.isnan(v)}, reverse=True):
        first = {v: min((n for n, loss in curve.items() if loss <= target), default=None)
                 for v, curve in losses.items()}
        factor = first["plain"] / first["augmented"] if first["plain"] and first["augmented"] else None
        rows.append({"loss": round(target, 6), "n_plain": first["plain"], "n_augmented": first["augmented"],
                     "factor": factor})
    return rows


def _curve_figure(curves: dict, ns: Sequence[int]) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key in zip(axes, ("eval_loss", "error")):
        for variant, curve in curves.items():
            ax.errorbar(ns, [curve[n][key][0] for n in ns], yerr=[curve[n][key][1] for n in ns], marker="o",
                        capsize=3, label=variant)
        ax.set(xscale="log", yscale="log" if key == "eval_loss" else "linear", xlabel="training alphabet size n",
               ylabel="test " + ("loss" if key == "eval_loss" else "error"))
        ax.set_xticks(ns, [str(n) for n in ns])
    axes[0].legend()
    fig.tight_layout()
    return fig


def _curve_rows(curves: dict, ns: Sequence[int]) -> list[list[Any]]:
    return [[n, v, "{:.4f} +- {:.4f}".format(*curves[v][n]["eval_loss"]),
             "{:.3f} +- {:.3f}".format(*curves[v][n]["error"])]
            for n in ns for v in curves]


def _jsonable(curves: dict) -> dict:
    return {v: {str(n): {k: list(ms) for k, ms in c.items()} for n, c in curve.items()} for v, curve in curves.items()}


# ---------------------------------------------------------------------------------------------
# templates-mlp-control

MLP_EMBEDDINGS = {"mlp": "transformer", "mlp-onehot": "onehot"}  # cell kind -> models.mlp_control embeddings


def run_mlp_control(ctx: StudyContext) -> dict[str, Any]:
    """Each templates-efficiency plain cell's config (same task, n, seed, steps, batch, lr,
    test batch, device), trained as an MLP control instead (StudyContext.run_controls: a rerun
    skips the cells it finished)."""
    s, started = SCALES[ctx.scale], time.perf_counter()
    seeds = ctx.seeds_or(s.seeds)
    template = "same_different"
    cells = {Cell(kind, seed, (f"n{n}",)): cell_config(ctx.scale, template, n, False, seed)
             for seed in seeds for kind in MLP_EMBEDDINGS for n in s.ns}

    def train(name: str, cfg: RunConfig) -> dict[str, Any]:
        return train_mlp_control(cfg, embeddings=MLP_EMBEDDINGS[name.rsplit("-n", 1)[0]])

    results = ctx.run_controls(cells, train, where="mlp")

    def final(kind: str, n: int, seed: int) -> dict[str, Any]:
        return results[Cell(kind, seed, (f"n{n}",)).name]["final"]

    keys = ("eval_loss", "error", "train_split_acc")
    curves = {k: {n: {key: _mean_std([float(final(k, n, seed)[key]) for seed in seeds]) for key in keys}
                  for n in s.ns} for k in MLP_EMBEDDINGS}
    headline = {"template": template, **{f"{k}_{key}_at_max_n": curves[k][s.ns[-1]][key][0]
                                         for k in MLP_EMBEDDINGS for key in keys},
                **{f"{k}_min_error": min(curves[k][n]["error"][0] for n in s.ns) for k in MLP_EMBEDDINGS}}
    out = {"headline": headline, "curves": _jsonable(curves), "seeds": seeds, "embeddings": MLP_EMBEDDINGS,
           "cells": {name: {k: r[k] for k in ("final", "history", "seconds",
                                              "parameters")} for name, r in results.items()},
           "seconds": round(time.perf_counter() - started, 1)}
    rows = [[n, k, "{:.4f} +- {:.4f}".format(*curves[k][n]["eval_loss"]),
             "{:.3f} +- {:.3f}".format(*curves[k][n]["error"]),
             "{:.3f}".format(curves[k][n]["train_split_acc"][0])] for n in s.ns for k in MLP_EMBEDDINGS]
    sections = [
        ("MLP control: test loss on unseen symbols vs training alphabet size",
         figure_html(_curve_figure(curves, s.ns), "mean +- std over seeds; mlp: the transformer's frozen random "
                     "embeddings (d_model wide); mlp-onehot: one-hot symbols")
         + table_html(rows, ["n", "control", "test loss", "test error", "accuracy on training symbols"])),
    ]
    return ctx.finish(f"templates-mlp-control ({ctx.scale})", sections, out)


# ---------------------------------------------------------------------------------------------
# templates-copy-width


def run_copy_width(ctx: StudyContext) -> dict[str, Any]:
    s, started = SCALES[ctx.scale], time.perf_counter()
    cells = {Cell(v, None, (f"d{d}", f"n{n}")): cell_config(ctx.scale, "copy", n, aug, 0, d_model=d, n_vars=1)
             for v, aug in VARIANTS.items() for d in s.widths for n in s.width_ns}
    results = ctx.run_cells(cells)
    errors = {v: {d: {n: float(_final(results, Cell(v, None, (f"d{d}", f"n{n}")).name).get("error", math.nan))
                      for n in s.width_ns}
                  for d in s.widths} for v in VARIANTS}
    needed = {v: {d: smallest_n_below_target(errors[v][d]) for d in s.widths} for v in VARIANTS}
    out = {"headline": {"n_needed": {v: {str(d): n for d, n in row.items()} for v, row in needed.items()},
                        "error_target": ERROR_TARGET},
           "errors": {v: {str(d): {str(n): e for n, e in row.items()} for d, row in t.items()}
                      for v, t in errors.items()},
           "cells": {k: r.to_dict() for k, r in results.items()}, "seconds": round(time.perf_counter() - started, 1)}
    rows = [[v, d, *[f"{errors[v][d][n]:.3f}" for n in s.width_ns]] for v in VARIANTS for d in s.widths]
    sections = [
        (f"Training symbols needed for test error < {ERROR_TARGET} (copy, unseen symbols)",
         table_html([[d, needed["plain"][d], needed["augmented"][d]] for d in s.widths],
                    ["d_model", "n plain", "n augmented"])),
        ("Test error per width and n", table_html(rows, ["variant", "d_model", *[f"n={n}" for n in s.width_ns]])),
    ]
    return ctx.finish(f"templates-copy-width ({ctx.scale})", sections, out)


# ---------------------------------------------------------------------------------------------
# templates-heads


def run_heads(ctx: StudyContext) -> dict[str, Any]:
    s, started = SCALES[ctx.scale], time.perf_counter()
    setups = {"same_different": "label", "binding": "query"}  # template -> the corruption to patch with
    cells = {Cell(v, None, (t,)): cell_config(ctx.scale, t, s.heads_n,
                                              aug) for t in setups for v, aug in VARIANTS.items()}
    results = ctx.run_cells(cells)
    analyses: dict[str, Any] = {}
    sections = []
    for cell in cells:
        name, template = cell.name, cell.tags[0]
        if results[name].status != "done":
            analyses[name] = {"status": results[name].status}
            continue
        analyses[name] = analyse_heads(ctx.out / "runs" / name, setups[template], s.eval)
        sections.append((name, _heads_html(analyses[name])))
    headline = {name: {k: a.get(k) for k in ("acc", "acc_without_a", "acc_without_b", "max_association")}
                for name, a in analyses.items()}
    return ctx.finish(f"templates-heads ({ctx.scale})", sections,
                      {"headline": headline, "analyses": analyses, "seconds": round(time.perf_counter() - started, 1)})


def analyse_heads(run_dir, change: str, n_samples: int) -> dict[str, Any]:
    """Head scores, learned a_h/b_h, patching (per layer's attention output and per head's
    W_V W_O output) and accuracy with the identity terms switched off, on unseen symbols."""
    run = load_run(run_dir)
    clean = run.task.sample(n_samples, seeded_generator(11), split="test")
    corrupted, changed = run.task.corrupt(clean, seeded_generator(12), change=change)
    keep = changed[:, 0]
    clean, corrupted = clean.select(keep), corrupted.select(keep)
    heads = classify_heads(run.model, run.task, clean.tokens)
    metric = logit_diff_metric(clean, corrupted)
    layers = activation_patch(run.model, clean.tokens, corrupted.tokens, metric, "attn_out", ())
    per_head = patch_head_out(run.model, clean.tokens, corrupted.tokens, metric)
    out = {"acc": _accuracy(run.model, clean), "n_pairs": len(clean), "heads": heads.to_dict(),
           "max_association": round(heads.score("association").max().item(), 4),
           "patch_attn_out": [round(v, 4) for v in layers.values.tolist()],
           "patch_head_z": per_head.values.round(decimals=4).tolist()}
    if hasattr(run.model.blocks[0].attn, "identity_a"):
        out["a_h"] = [b.attn.identity_a.detach().round(decimals=3).tolist() for b in run.model.blocks]
        out["b_h"] = [b.attn.identity_b.detach().round(decimals=3).tolist() for b in run.model.blocks]
        for term in ("a", "b"):
            out[f"acc_without_{term}"] = _accuracy_without(run.model, clean, f"identity_{term}")
    return out


@torch.no_grad()
def _accuracy(model, batch) -> float:
    picked = logits_at_labels(model(batch.tokens), batch.label_pos)
    return round((picked.argmax(-1) == batch.labels).float().mean().item(), 4)


@torch.no_grad()
def _accuracy_without(model, batch, scalar: str) -> float:
    """Accuracy with one identity term (a_h or b_h of every head) set to 0, then restored."""
    saved = [getattr(b.attn, scalar).clone() for b in model.blocks]
    for block in model.blocks:
        getattr(block.attn, scalar).zero_()
    try:
        return _accuracy(model, batch)
    finally:
        for block, value in zip(model.blocks, saved):
            getattr(block.attn, scalar).copy_(value)


def _heads_html(a: dict[str, Any]) -> str:
    scores = a["heads"]["scores"]
    rows = [[f"L{layer}H{head}", a["heads"]["labels"][layer][head], scores["association"][layer][head],
             scores["self"][layer][head], a.get("a_h", [[None] * 4] * 9)[layer][head],
             a.get("b_h", [[None] * 4] * 9)[layer][head], a["patch_head_z"][layer][head]]
            for layer in range(len(scores["association"])) for head in range(len(scores["association"][0]))]
    summary = (f"<p>test accuracy {a['acc']} on {a['n_pairs']} pairs; without a_h: {a.get('acc_without_a')}, "
               f"without b_h: {a.get('acc_without_b')}; attention-output patching per layer: {a['patch_attn_out']}</p>")
    return summary + table_html(rows, ["head", "label", "association", "self", "a_h", "b_h", "patch (W_V W_O part)"])


STUDIES = [
    Study("templates-efficiency", "same-different on unseen symbols: test loss vs training alphabet size, plain vs "
          "identity-augmented attention", run_efficiency),
    Study("templates-copy-width", "copy template: training symbols needed for error < 0.05 per width, "
                                  "plain vs augmented",
          run_copy_width),
    Study("templates-mlp-control", "same-different on unseen symbols: a plain MLP over the concatenated embeddings "
          "(transformer's frozen random ones, and one-hot) on the templates-efficiency cells' data", run_mlp_control),
    Study("templates-heads", "augmented models: do heads attend to repeated symbols? head scores, a_h/b_h, patching, "
          "identity terms off", run_heads),
]


# ---------------------------------------------------------------------------------------------
# reading a sweep of templates runs


def sweep_rows(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """Per run under `folders` (e.g. `workbench sweep --preset templates-cpu --grid
    task.n_train_symbols=... model.identity_attention=false,true`): its alphabet size, variant,
    identity lr scale, seed, lr, embeddings (frozen or trained), steps trained and why it stopped,
    its last evaluation's test loss and
    error (unseen symbols), and the largest |a_h| and |b_h| of an augmented model (read from its
    weights: for an "unfinished" run, its last checkpoint's, which can be older than its last
    evaluation)."""
    rows = []
    for folder in (run for where in folders for run in run_folders(where)):
        run = load_run(folder)
        cfg, last = run.config, (run.metrics or [{}])[-1]
        augmented = cfg.model.identity_attention
        row = {"run": str(folder), "template": cfg.task.template, "d_model": cfg.model.d_model,
               "n": cfg.task.n_train_symbols,
               "variant": "augmented" if augmented else "plain", "identity_lr_scale": cfg.train.identity_lr_scale,
               "seed": cfg.train.seed, "lr": cfg.train.lr,
               "embeddings": "frozen" if cfg.model.fixed_embeddings else "trained",
               "steps": last.get("step"), "of_steps": cfg.train.steps,
               "stopped": how_it_ended(last, last.get("step"), cfg.train.steps),
               "test_loss": last.get("eval_loss"), "test_error": last.get("error")}
        if augmented:
            for name, param in (("max_abs_a_h", "identity_a"), ("max_abs_b_h", "identity_b")):
                row[name] = round(max(getattr(b.attn, param).abs().max().item() for b in run.model.blocks), 4)
        rows.append(row)
    return rows


def _variant(row: dict[str, Any]) -> tuple[str, float, str]:
    """What tells a run's curve apart within a (template, width, seed): plain or the augmented
    model's identity lr scale, then the lr and the embeddings."""
    kind = "plain" if row["variant"] == "plain" else f"identity_lr_scale {row['identity_lr_scale']}"
    return kind, row.get("lr"), row.get("embeddings", "frozen")


def sweep_factors(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per template, width and seed, for every plain curve against every augmented one (a curve:
    the runs of one variant, lr and embeddings): `data_factors` of the plain runs against the
    augmented ones, and the smallest n at which each one's test error is below ERROR_TARGET (None:
    at no n; templates-copy-width's measure). Seeds are compared within, not averaged: a second run
    of the same n on one curve is refused. Unfinished runs are left out."""
    curves: dict[tuple[str, int, int], dict[tuple[str, float, str], dict[int, dict[str, Any]]]] = {}
    for row in (r for r in rows if r["stopped"] != "unfinished"):
        variant = _variant(row)
        curve = curves.setdefault((row["template"], row["d_model"], row.get("seed", 0)), {}).setdefault(variant, {})
        if row["n"] in curve:
            raise ValueError(f"two {row['variant']} runs ({variant[0]}, lr {variant[1]}, {variant[2]} embeddings) of "
                             f"{row['template']} at d_model {row['d_model']}, seed {row.get('seed', 0)}, with n = "
                             f"{row['n']}; sweep_factors reads one run per n and curve")
        curve[row["n"]] = row
    out = []
    for (template, width, seed), variants in curves.items():
        plains = {v: c for v, c in variants.items() if v[0] == "plain"}
        for (kind, lr, embeddings), augmented in variants.items():
            if kind == "plain":
                continue
            for (_, plain_lr, plain_embeddings), plain in plains.items():
                needed = {name: smallest_n_below_target({n: r["test_error"] for n, r in c.items()})
                          for name, c in (("plain", plain), ("augmented", augmented))}
                out.append({"template": template, "d_model": width, "seed": seed, "augmented": kind,
                            "augmented_lr": lr, "plain_lr": plain_lr, "embeddings": [plain_embeddings, embeddings],
                            "factors": data_factors({"plain": {n: r["test_loss"] for n, r in plain.items()},
                                                     "augmented": {n: r["test_loss"] for n, r in augmented.items()}}),
                            f"n_to_error_below_{ERROR_TARGET}": needed})
    return out


def sweep_means(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per template, width, curve and n trained in more than one seed: the seeds, and the mean and
    standard deviation (over seeds, as the studies' tables: `_mean_std`) of the test loss and error.
    Unfinished runs are left out."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in (r for r in rows if r["stopped"] != "unfinished"):
        groups.setdefault((row["template"], row["d_model"], *_variant(row), row["n"]), []).append(row)
    out = []
    for (template, width, kind, lr, embeddings, n), runs in groups.items():
        if len(runs) < 2:
            continue
        (loss, loss_std), (error, error_std) = (_mean_std([r[k] for r in runs]) for k in ("test_loss", "test_error"))
        out.append({"template": template, "d_model": width, "variant": kind, "lr": lr, "embeddings": embeddings,
                    "n": n, "seeds": sorted(r.get("seed", 0) for r in runs),
                    "test_loss_mean": round(loss, 4), "test_loss_std": round(loss_std, 4),
                    "test_error_mean": round(error, 4), "test_error_std": round(error_std, 4)})
    return sorted(out, key=lambda m: (m["template"], m["d_model"], m["variant"], m["lr"], m["embeddings"], m["n"]))


def main(argv: list[str] | None = None) -> int:
    """`python -m analyses.studies.templates SWEEP_DIR...`: one line per templates run (n, width,
    variant, steps, test loss and error on unseen symbols, |a_h|, |b_h|), then per template and
    width and seed the data-efficiency factors of plain vs augmented (per identity lr scale) and
    the smallest n with test error below 0.05; then, where an n was trained in several seeds, the
    mean and standard deviation over them."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    parser.add_argument("sweep_dirs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.sweep_dirs if not d.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = sweep_rows(args.sweep_dirs)
    if not rows:
        print(f"error: no run folder (config.json with model.safetensors) under {', '.join(map(str, args.sweep_dirs))}",
              file=sys.stderr)
        return 2
    for row in sorted(rows, key=lambda r: (r["template"], r["d_model"], r["n"], r["variant"], r["identity_lr_scale"])):
        print(json.dumps(row))
    for factors in sweep_factors(rows):
        print(json.dumps(factors))
    for means in sweep_means(rows):
        print(json.dumps(means))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
