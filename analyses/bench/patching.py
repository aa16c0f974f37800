"""Patching benchmark: our batched exact sweep against TransformerLens's loop, and attribution
against exact, measured side by side in one process (ratios carry the message, not absolute
times on a shared machine).

    python -m analyses.bench.patching RUN_DIR [--n-pairs 32] [--seed 0] [--repeats 3] [--ig-steps 2,4]

Reports, on the same counterfactual pairs (the task's `corrupt()`, logit difference at one
label slot): the time of `patch_head_out_by_pos` vs `transformer_lens.patching.
get_act_patch_attn_head_out_by_pos` (target: ours >= 3x faster) and their max abs difference;
the time of `attribute_head_out_by_pos` vs exact (target >= 50x faster); and the Spearman
correlation of attribution with exact over head-output cells (target >= 0.8), both per
(layer, pos, head) and per (layer, head) since "head outputs" can mean either; beside each,
AtP*'s yardstick (`verified_*`): the fraction of cells verified by exact patching in
attribution's order before exact's top 3 cells are all verified (target, by position: <= 0.05;
per head there is none). Also, so that no
number is picked: the same correlations for every label slot the corruption changes, and for
the head where attribution misses most, the metric along the straight line from its corrupted
to its clean output (`blend_curve`), with downstream MLPs or attention patterns held fixed.
Attribution extrapolates the slope at the corrupted end of that line. With --ig-steps, the
same speed-up and correlations for integrated gradients (`steps=K`), which averages the slope
over K points of the line between the two inputs' embeddings. Last, AtP*'s yardstick side by
side (interp.atp, as `python -m analyses.research.atp_yardstick` computes it over many runs): for head
outputs, queries and keys, by position and per head, the verified fraction, Spearman and time of
plain attribution, GradDrop, integrated gradients (the largest of --ig-steps, else 4 steps) and,
for queries and keys, the QK fix alone and with GradDrop.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from interp.atp import CELLS, judge_all_cells, judge_estimates
from interp.patching import (
    PatchResult,
    attribute_head_out,
    attribute_head_out_by_pos,
    logit_diff_metric,
    patch_head_out,
    patch_head_out_by_pos,
)
from models.factory import build_model
from models.runs import load_run
from tasks import Batch, Task, logits_at_labels, seeded_generator


def best_times(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """The fastest of `repeats` runs in wall-clock and in CPU seconds; CPU time is less
    disturbed when other processes share the cores."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def unaligned_pairs(task: Task, n_pairs: int, seed: int) -> tuple[Batch, Batch]:
    """The task's counterfactual pairs, each row with its own layout (per-head sweeps do not
    need positions to line up): LEGO flips chain depth 0, composite changes the key."""
    clean, corrupted, _ = task.counterfactual_pairs(n_pairs, seeded_generator(seed), aligned=False)
    return clean, corrupted


def label_accuracy(model: Any, batch: Batch, label_index: int) -> float:
    """How trained the model is on the slot the metric reads."""
    with torch.no_grad():
        predictions = logits_at_labels(model(batch.tokens), batch.label_pos).argmax(-1)
    return (predictions[:, label_index] == batch.labels[:, label_index]).float().mean().item()


def transformer_lens_by_pos(model: Any, clean: Tensor, corrupted: Tensor, metric: Callable) -> Tensor:
    """TransformerLens's own head-by-position sweep (one full forward pass per cell)."""
    from transformer_lens.patching import get_act_patch_attn_head_out_by_pos

    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # its per-cell progress bar
        _, clean_cache = model.run_with_cache(clean)
        return get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, lambda logits: metric(logits).mean())


def exact_head_patching(model: Any, clean: Batch, corrupted: Batch, metric: Callable) -> tuple[PatchResult,
                                                                                               PatchResult]:
    """Exact patching per (layer, pos, head) and per (layer, head)."""
    args = (model, clean.tokens, corrupted.tokens, metric)
    return patch_head_out_by_pos(*args), patch_head_out(*args)


def attribution_agreement(model: Any, clean: Batch, corrupted: Batch, metric: Callable, steps: int = 1,
                          exact: tuple[PatchResult, PatchResult] | None = None) -> dict[str, float]:
    """How attribution (`steps` > 1: integrated gradients) agrees with exact patching
    (`exact_head_patching`, computed when not given) over head-output cells, per (layer, pos,
    head) and per (layer, head): Spearman's correlation, and AtP*'s yardstick, the fraction of
    cells verified in attribution's order before exact's top 3 are all verified (interp.atp)."""
    args = (model, clean.tokens, corrupted.tokens, metric)
    by_pos, per_head = exact if exact is not None else exact_head_patching(model, clean, corrupted, metric)
    name = "atp" if steps == 1 else f"ig{steps}"
    found = {}
    for key, cells, truth in (("head_out_by_pos", "head x pos", by_pos), ("head_out", "head", per_head)):
        judged = judge_estimates(*args, cells, truth, ig_steps=steps, names=[name])[name]
        found[f"spearman_{key}"], found[f"verified_{key}"] = judged.spearman, judged.fraction
    return found


def integrated_gradients_tradeoff(model: Any, clean: Batch, corrupted: Batch, metric: Callable, time_exact: float,
                                  cpu_exact: float, steps: Sequence[int], repeats: int,
                                  exact: tuple[Tensor, Tensor]) -> dict[str, float]:
    """For each number of integrated-gradient steps: speed-up over the exact head-by-position
    sweep (wall and CPU, timed in the same process) and the Spearman correlations with `exact`
    (`exact_head_patching`)."""
    args = (model, clean.tokens, corrupted.tokens, metric)
    results: dict[str, float] = {}
    for k in steps:
        wall, cpu = best_times(lambda k=k: attribute_head_out_by_pos(*args, steps=k), repeats)
        results[f"ig{k}_speedup_vs_exact"] = time_exact / wall
        results[f"ig{k}_cpu_speedup_vs_exact"] = cpu_exact / cpu
        results.update({f"ig{k}_{key}": value for key, value in
                        attribution_agreement(model, clean, corrupted, metric, k, exact).items()})
    return results


def agreement_by_slot(model: Any, clean: Batch, corrupted: Batch, ig_steps: Sequence[int] = ()) -> dict[str, float]:
    """`attribution_agreement` (one step, then each of `ig_steps`) for every label slot the
    corruption changes in all pairs, with how well the model predicts that slot: all slots, so
    none is picked for its correlation."""
    results: dict[str, float] = {}
    for slot in range(clean.labels.shape[1]):
        if not (clean.label_mask[:, slot] & (clean.labels[:, slot] != corrupted.labels[:, slot])).all():
            continue
        metric = logit_diff_metric(clean, corrupted, slot)
        exact = exact_head_patching(model, clean, corrupted, metric)
        results[f"slot{slot}_label_accuracy"] = label_accuracy(model, clean, slot)
        for k in (1, *ig_steps):
            prefix = f"slot{slot}_" if k == 1 else f"slot{slot}_ig{k}_"
            results.update({prefix + key: value for key, value in
                            attribution_agreement(model, clean, corrupted, metric, k, exact).items()})
    return results


FREEZABLE = {"mlp": "blocks.{layer}.hook_mlp_out", "pattern": "blocks.{layer}.attn.hook_pattern"}


@torch.no_grad()
def blend_curve(
    model: Any, clean: Tensor, corrupted: Tensor, metric: Callable, layer: int, head: int,
    alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0), freeze: tuple[str, ...] = (),
) -> list[float]:
    """Mean metric on the corrupted run with head `head`'s output (all positions) moved a
    fraction alpha of the way to its clean value: alpha=1 is exact clean -> corrupted patching,
    and attribution extrapolates the slope at alpha=0. `freeze` holds the given kinds
    (FREEZABLE) at their corrupted values from block `layer` on, to locate the nonlinearity."""
    _, clean_cache = model.run_with_cache(clean, names_filter=lambda h: h.endswith("attn.hook_z"))
    _, corrupted_cache = model.run_with_cache(corrupted)
    z_name = f"blocks.{layer}.attn.hook_z"
    frozen = [(FREEZABLE[kind].format(layer=later), lambda act, hook: corrupted_cache[hook.name])
              for kind in freeze for later in range(layer, model.cfg.n_layers)]
    curve = []
    for alpha in alphas:
        def blend(z: Tensor, hook: Any, alpha: float = alpha) -> Tensor:
            z = z.clone()
            z[:, :, head] += alpha * (clean_cache[hook.name][:, :, head] - z[:, :, head])
            return z
        logits = model.run_with_hooks(corrupted, fwd_hooks=[(z_name, blend), *frozen])
        curve.append(metric(logits).mean().item())
    return curve


def worst_missed_head(model: Any, clean: Batch, corrupted: Batch, metric: Callable) -> dict[str, Any]:
    """The (layer, head) cell where attribution and exact patching disagree most, and the blend
    curve of that head with nothing, the downstream MLPs, or the downstream attention patterns
    frozen: where the metric's response to the head is nonlinear, and which part makes it so."""
    args = (model, clean.tokens, corrupted.tokens, metric)
    exact, estimate = patch_head_out(*args), attribute_head_out(*args)
    layer, head = divmod(int((exact.values - estimate.values).abs().argmax()), exact.values.shape[1])
    return {
        "worst_head": f"L{layer}H{head}", "worst_head_exact": exact.values[layer, head].item(),
        "worst_head_attribution": estimate.values[layer, head].item(),
        **{f"blend_curve_freeze_{'_'.join(f) or 'none'}": blend_curve(*args, layer, head, freeze=f)
           for f in ((), ("mlp",), ("pattern",))},
    }


def cells_key(cells: str) -> str:
    """The results' name of interp.atp's `cells`: head_out_by_pos, head_out, q_by_pos, q, ..."""
    kind, over = CELLS[cells]
    return f"{kind}_by_pos" if "pos" in over else kind


def estimates_side_by_side(model: Any, clean: Batch, corrupted: Batch, metric: Callable, ig_steps: int, repeats: int,
                           k: int = 3) -> dict[str, float]:
    """AtP*'s yardstick for every estimate of interp.atp on every kind of cells of interp.atp
    (skipping kinds with no more than k cells): `yardstick.{cells}.{estimate}.verified` (the
    fraction of the exact sweep verified in the estimate's order until exact's top k are),
    `.spearman` and `.time_s` (the fastest of `repeats`); `yardstick.{cells}.exact.time_s` (one
    run of the exact sweep) and `yardstick.{cells}.n_cells`."""
    results: dict[str, float] = {}
    judged = judge_all_cells(model, clean.tokens, corrupted.tokens, metric, ig_steps=ig_steps, k=k, repeats=repeats)
    for cells, kinds in judged.items():
        prefix = f"yardstick.{cells_key(cells)}."
        results[prefix + "n_cells"] = kinds.exact.values.numel()
        results[prefix + "exact.time_s"] = kinds.exact_seconds
        for name, one in kinds.estimates.items():
            results.update({prefix + f"{name}.verified": one.fraction, prefix + f"{name}.spearman": one.spearman,
                            prefix + f"{name}.time_s": one.seconds})
    return results


def run_patching_benchmark(
    model: Any, task: Task, n_pairs: int = 32, seed: int = 0, repeats: int = 3, label_index: int = 0,
    ig_steps: Sequence[int] = (),
) -> dict[str, Any]:
    """Times and agreement of exact, TransformerLens and attribution patching on head outputs,
    with the logit difference at label slot `label_index` (LEGO: variable #label_index); then
    `estimates_side_by_side` with the largest of `ig_steps` (4 without)."""
    clean, corrupted = unaligned_pairs(task, n_pairs, seed)
    metric = logit_diff_metric(clean, corrupted, label_index)
    args = (model, clean.tokens, corrupted.tokens, metric)
    exact = patch_head_out_by_pos(*args)
    reference = transformer_lens_by_pos(*args)
    t_tl, cpu_tl = best_times(lambda: transformer_lens_by_pos(*args), repeats)
    t_exact, cpu_exact = best_times(lambda: patch_head_out_by_pos(*args), repeats)
    t_attribution, cpu_attribution = best_times(lambda: attribute_head_out_by_pos(*args), 3 * repeats)
    exact_values = (exact, patch_head_out(*args))  # what every agreement below compares with
    return {
        "n_pairs": n_pairs, "n_cells": exact.values.numel(), "label_index": label_index,
        "label_accuracy": label_accuracy(model, clean, label_index),
        "clean_metric": exact.clean_metric, "corrupted_metric": exact.corrupted_metric,
        "max_abs_diff_vs_transformer_lens": (exact.raw - reference.cpu()).abs().max().item(),
        "time_transformer_lens_s": t_tl, "time_exact_s": t_exact, "time_attribution_s": t_attribution,
        "speedup_exact_vs_transformer_lens": t_tl / t_exact,
        "speedup_attribution_vs_exact": t_exact / t_attribution,
        "cpu_speedup_exact_vs_transformer_lens": cpu_tl / cpu_exact,
        "cpu_speedup_attribution_vs_exact": cpu_exact / cpu_attribution,
        **attribution_agreement(model, clean, corrupted, metric, exact=exact_values),
        **agreement_by_slot(model, clean, corrupted, ig_steps),
        **worst_missed_head(model, clean, corrupted, metric),
        **integrated_gradients_tradeoff(model, clean, corrupted, metric, t_exact, cpu_exact, ig_steps, 3 * repeats,
                                        exact_values),
        **estimates_side_by_side(model, clean, corrupted, metric, max(ig_steps, default=4), 3 * repeats),
    }


def agreement_at_init(run: Any, n_pairs: int, seed: int, label_index: int) -> dict[str, float]:
    """The same Spearman correlations on freshly initialised weights of the run's config: a
    reference for how far training (saturated attention and MLPs) moves the first-order
    estimate away from exact."""
    model = build_model(run.config.model, run.task, seed=run.config.train.seed)
    clean, corrupted = unaligned_pairs(run.task, n_pairs, seed)
    agreement = attribution_agreement(model, clean, corrupted, logit_diff_metric(clean, corrupted, label_index))
    return {f"{key}_at_init": value for key, value in agreement.items()}


TARGETS = {"speedup_exact_vs_transformer_lens": 3.0, "speedup_attribution_vs_exact": 50.0,
           "cpu_speedup_exact_vs_transformer_lens": 3.0, "cpu_speedup_attribution_vs_exact": 50.0,
           "spearman_head_out_by_pos": 0.8, "spearman_head_out": 0.8}
AT_MOST = {"verified_head_out_by_pos": 0.05}


def print_report(results: dict[str, Any]) -> None:
    for key, value in results.items():
        if key.startswith("yardstick."):  # printed as one table below
            continue
        target, ceiling = TARGETS.get(key), AT_MOST.get(key)
        verdict = "" if target is None else f"   target >= {target}: {'met' if value >= target else 'NOT met'}"
        if ceiling is not None:
            verdict = f"   target <= {ceiling}: {'met' if value <= ceiling else 'NOT met'}"
        if isinstance(value, list):
            shown = " ".join(f"{v:.3g}" for v in value)
        else:
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"{key:36s} {shown:>12s}{verdict}")
    if any(key.startswith("yardstick.") for key in results):
        print("\n".join(["", *yardstick_table(results)]))


def yardstick_table(results: dict[str, Any], k: int = 3) -> list[str]:
    """`estimates_side_by_side`'s keys as one table, a row per (cells, estimate)."""
    lines = ["AtP*'s yardstick: the fraction of the exact sweep verified in each estimate's order until exact's top "
             f"{k} cells are all verified (target by position <= {AT_MOST['verified_head_out_by_pos']}); Spearman with "
             "exact; time (estimates: fastest of the repeats; exact: one run)",
             f"{'cells':10s} {'n':>5s}  {'estimate':16s} {'verified':>8s} {'spearman':>8s} {'time s':>8s}"]
    for cells in CELLS:
        prefix = f"yardstick.{cells_key(cells)}."
        names = [key[len(prefix):-len(".time_s")] for key in results
                 if key.startswith(prefix) and key.endswith(".time_s")]
        for name in names:
            judged = [f"{results.get(prefix + name + measure, math.nan):8.3f}" for measure in (".verified",
                                                                                               ".spearman")]
            if name == "exact":
                judged = [f"{'':8s}"] * 2
            lines.append(f"{cells:10s} {results[prefix + 'n_cells']:5d}  {name:16s} {' '.join(judged)} "
                         f"{results[prefix + name + '.time_s']:8.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a trained run folder (workbench train --out ...)")
    parser.add_argument("--n-pairs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label-index", type=int, default=0, help="label slot the metric reads (LEGO: variable #i)")
    parser.add_argument("--ig-steps", default="", help="comma-separated integrated-gradient step counts to time and "
                                                           "correlate too, e.g. 2,4,8 (default: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps the comparison fair "
                                                               "on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run = load_run(args.run_dir)
    print(f"run {run.path} ({run.config.task.name}), model {run.config.model}")
    ig_steps = [int(k) for k in args.ig_steps.split(",") if k.strip()]
    results = run_patching_benchmark(run.model, run.task, args.n_pairs, args.seed, args.repeats, args.label_index,
                                     ig_steps)
    print_report({**results, **agreement_at_init(run, args.n_pairs, args.seed, args.label_index)})


if __name__ == "__main__":
    main()
