"""The LEGO study (docs/papers.md, section 1): eight experiments, each `workbench study lego-<name>`.

All experiments draw their models from one pool of run folders, `<out>/../lego-runs-<scale>/`,
named by what distinguishes them (e.g. `albert-s0`), so an experiment that needs a model another
one trained (percolation and heads reuse the extrapolation models) finds it finished and skips
it. Scales:

- tiny: seconds per model; only checks that everything runs.
- cpu: "bert", "albert" and "albert-sd" are **learned**: plain models (nothing planted or
  mimicked) trained by the `lego-three-hops` curriculum (interp/tasks/lego_presets.py): one hop with six
  letters, then #0-#4 of n = 6, then #0-#4 of n = 8 with eight letters, each stage starting from
  the last one's weights; 4 layers, d 64, rotary, compiled bf16 (the tied kinds: the
  `lego-three-hops-albert` curriculum, whose first stage is 6,000 steps). #5-#7 are never
  supervised, so they measure extrapolation. Each such model is about 30 minutes of one core (RESULTS.md), its
  first stages in `<pool>/stages/`. "albert" ties all layers. The other kinds keep the
  `lego-cpu` recipe (n = 6, #0-#2): "standard" is its plain model, "mimic", "hardcoded" and
  "hybrid3" plant or mimic heads as named, the ground-truth experiments they are.
- gpu: the `lego-gpu` preset for one GPU: n = 12, #0-#5 supervised (so #6-#11 measure
  extrapolation), 8 layers of d 256 (12 for the deeper pair), batch 512, bf16, 20,000 steps.
  Sized by FLOP count, an estimate: 1.25 TFLOP per step at 8 layers and 1.87 at 12 (torch's
  FlopCounterMode, forward and backward), 25-37 PFLOP per model, 2-6 minutes at the 100-200
  TFLOP/s an H100 reaches in bf16; wall times are measured only where a GPU was at hand
  (analyses/RESULTS.md). Unlike the cpu and paper scales its models are **plain**: nothing is
  planted, so "bert" and "standard" are the same recipe and every head a study labels was
  learned ("hardcoded" and "hybrid3" still plant their own). Two seeds by default.
- paper: the paper's recipe (n = 12, #0-#5 supervised, BERT-base sizes); for a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyses.runners.study import Cell, Study, StudyContext
from analyses.studies.lego_pool import (
    SCALES,
    accuracy_rows,
    chance,
    curriculum,
    curves_html,
    finish,
    finished,
    groups,
    last_stages,
    mean_over_seeds,
    plan,
    pool_dir,
    seeds,
    supervised_mask,
    train_pool,
    variant,
)
from interp import plots
from interp.attention import classify_heads
from interp.patching import logit_diff_metric, patch_head_out
from interp.report import figure_html, table_html
from interp.task_analysis import counterfactual_pairs
from interp.tasks.lego import (
    last_variable_evidence,
    last_variable_evidence_html,
    lego_accuracy_figure,
    parity_rules_section,
)
from interp.tasks.lego_probes import lego_probe_map, percolation_summary, resolved_depths
from interp.tasks.lego_verdict import extrapolates, last_learned_before_middle, learned_steps, lego_parity_rules
from models.config import RunConfig
from models.runs import MIMIC, load_run, read_json, read_metrics
from tasks import seeded_generator

# ---------------------------------------------------------------- the experiments


def extrapolation_study(ctx: StudyContext, group: str = "z2") -> dict[str, Any]:
    """Finding 2: train on the first k of n variables; does ALBERT extrapolate beyond k better than BERT?"""
    tags = () if group == "z2" else (group,)
    layer_options = SCALES[ctx.scale].depths if group == "z2" else SCALES[ctx.scale].depths[:1]
    planned = dict(plan(ctx, kind, seed, layers, *tags, group=group)
                   for layers in layer_options for kind in ("bert", "albert") for seed in seeds(ctx, pairs=True))
    train_pool(ctx, planned)
    cells = last_stages(planned)
    rows, table = accuracy_rows(ctx, cells)
    supervised = supervised_mask(next(iter(cells.values())))
    first = supervised.index(False) if False in supervised else None
    headline = {}
    for group_name in groups(cells):
        mean = mean_over_seeds(table, cells, group_name)
        headline[f"{group_name}_mean_acc_per_var"] = mean
        if mean is not None and first is not None:
            headline[f"{group_name}_first_unsupervised"] = mean[first]
            headline[f"{group_name}_unsupervised_mean"] = round(float(np.mean(mean[first:])), 4)
    learned = {name: learned_steps(read_metrics(pool_dir(ctx) / name), len(supervised)) for name in table}
    rules = _rules_of(ctx, table)
    sections = [
        ("Final accuracy per variable", figure_html(lego_accuracy_figure(table, supervised, f"{group}: BERT vs ALBERT",
                                                                         chance(next(iter(cells.values())))),
                                                    "Final test accuracy per variable; shaded: never supervised.")
         + table_html(rows, ["model", *[f"#{i}" for i in range(len(supervised))]])
         + "<p>* = not supervised (extrapolation).</p>"),
        ("Accuracy over training (Figure 3)", "".join(curves_html(ctx, cell.name, c,
                                                                  cell.name) for cell, c in cells.items())),
        ("Step at which each variable reached 95%", table_html([[n, *s] for n, s in learned.items()],
                                                               ["model", *[f"#{i}" for i in range(len(supervised))]])),
    ]
    if rules:
        sections.append(parity_rules_section(rules))
        headline["unsupervised_rules"] = {n: [r["rule"] for r in model_rules[first:]]
                                          for n, model_rules in rules.items()}
    return finish(ctx, f"LEGO ({group}): BERT vs ALBERT, length extrapolation", sections,
                  {"final_acc": table, "learned_step": learned,
                   "parity_rules": rules, "headline": headline})


def _rules_of(ctx: StudyContext, names) -> dict[str, list[dict[str, Any]]]:
    """`lego_parity_rules` of each trained Z2 model, on 2,000 test sentences (200 at tiny scale)."""
    n = SCALES[ctx.scale].rule_samples
    found = {}
    for name in names:
        run = load_run(pool_dir(ctx) / name)
        if run.config.task.group == "z2":
            found[name] = [r.summary() for r in lego_parity_rules(run.model, run.task, n=n)]
    return found


def percolation_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 3: the (layer x depth) probe map of BERT and ALBERT; is ALBERT's closer to one layer per step?"""
    layers = SCALES[ctx.scale].depths[-1]
    planned = dict(plan(ctx, kind, seed, layers) for seed in seeds(ctx, pairs=True) for kind in ("bert", "albert"))
    train_pool(ctx, planned)
    cells = last_stages(planned)
    maps, sections, headline = {}, [], {}
    n = SCALES[ctx.scale].probe_samples
    for name in (cell.name for cell in cells):
        run = load_run(pool_dir(ctx) / name)
        probe = lego_probe_map(run.model, run.task, n_train=n[0], n_test=n[1])
        maps[name] = probe.to_dict()
        headline[name] = {"slope": probe.slope, "linearity": probe.linearity, "first_layer": probe.first_layer,
                          "resolved_depths": resolved_depths(probe.first_layer)}
        sections.append((f"Probe map: {name}", figure_html(
            plots.heatmap(probe.accuracy.tolist(), "chain depth", "layer", f"{name}: probe accuracy", probe.depth_names,
                          vmin=0.5, vmax=1.0, cmap="viridis"),
            f"Linear-probe test accuracy at each variable's token; {percolation_summary(probe.first_layer)}; "
            f"first layer reaching {probe.threshold:.0%} per depth {probe.first_layer}.")))
    return finish(ctx, "LEGO: information percolation (Figure 4)", sections,
                  {"probes": maps, "headline": headline})


def stochastic_depth_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 4: ALBERT with a depth drawn per batch (full depth at test) vs fixed depth."""
    layers = SCALES[ctx.scale].depths[-1]
    planned = dict(plan(ctx, kind, seed, layers) for kind in ("albert", "albert-sd") for seed in seeds(ctx, pairs=True))
    train_pool(ctx, planned)
    return _comparison(ctx, last_stages(planned), "LEGO: stochastic depth for ALBERT (Figure 5)")


def mimic_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 6: mimicking initialisation (association / conv heads learned on random tokens) vs random init."""
    cells = {Cell(kind, seed): variant(ctx.scale, kind, seed) for kind in ("standard", "mimic") for seed in seeds(ctx)}
    train_pool(ctx, cells)
    mimic_files = {cell.name: pool_dir(ctx) / cell.name / MIMIC for cell in cells if cell.kind == "mimic"}
    extra = {"mimic_pretraining": {name: read_json(f) for name, f in mimic_files.items() if f.exists()}}
    return _comparison(ctx, cells, "LEGO: mimicking initialisation (Figure 6)", extra)


def hardcoded_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 8: association/manipulation/broadcast heads hardcoded in every layer, alone and with learned heads."""
    cells = {Cell(kind, seed): variant(ctx.scale, kind, seed) for kind in ("standard", "hardcoded", "hybrid3")
             for seed in seeds(ctx)}
    train_pool(ctx, cells)
    return _comparison(ctx, cells, "LEGO: hardcoded attention vs hybrid vs standard")


def _comparison(ctx: StudyContext, cells: dict[Cell, RunConfig], title: str,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Final accuracy, test loss and curves of trained models side by side; the headline
    averages each group of cells over seeds."""
    rows, table = accuracy_rows(ctx, cells)
    supervised = supervised_mask(next(iter(cells.values())))
    losses = {n: [r for r in read_metrics(pool_dir(ctx) / n) if "eval_loss" in r][-1]["eval_loss"] for n in table}
    headline = {group: mean_over_seeds(table, cells, group) for group in groups(cells)}
    headline["final_eval_loss"] = {n: round(v, 4) for n, v in losses.items()}
    sections = [
        ("Final accuracy per variable", figure_html(lego_accuracy_figure(table, supervised, title,
                                                                         chance(next(iter(cells.values())))), "")
         + table_html(rows, ["model", *[f"#{i}" for i in range(len(supervised))]])
         + table_html([[n, f"{v:.4f}"] for n, v in losses.items()], ["model", "final test loss (supervised)"])),
        ("Accuracy over training", "".join(curves_html(ctx, cell.name, c, cell.name) for cell, c in cells.items())),
    ]
    rules = _rules_of(ctx, table)
    if rules:
        sections.append(parity_rules_section(rules))
    return finish(ctx, title, sections, {"final_acc": table, "headline": headline, "parity_rules": rules,
                                         **(extra or {})})


def shortcut_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 7: (a) trained on every variable, is the last one learned first, and how is it
    computed? (b) supervising #0..#k-2 plus the last vs #0..#k-1: extrapolation to the middle."""
    seed = seeds(ctx)[0]
    every = Cell("standard", seed, ("all",))
    bert, bert_configs = plan(ctx, "bert", seed)
    n_sup = bert_configs[-1].task.n_supervised
    planned = {
        every: [variant(ctx.scale, "standard", seed, supervision="all")],
        bert: bert_configs,
        **dict([plan(ctx, "bert", seed, None, "lastsup", supervision="first+last", n_supervised=n_sup - 1)]),
    }
    train_pool(ctx, planned)
    cells = last_stages(planned)
    all_name = every.name
    metrics = read_metrics(pool_dir(ctx) / all_name)
    n_vars = cells[every].task.n_vars
    steps = learned_steps(metrics, n_vars)
    shortcut = last_learned_before_middle(steps)
    # a partly learned shortcut stays below 95%; 75% is far above chance (50%) and shows the order too
    steps_75 = learned_steps(metrics, n_vars, threshold=0.75)
    shortcut_75 = last_learned_before_middle(steps_75)
    run = load_run(pool_dir(ctx) / all_name) if metrics else None  # None: the model did not train
    evidence = last_variable_evidence(run.model, run.task, *SCALES[ctx.scale].probe_samples) if run else {}
    rows, table = accuracy_rows(ctx, {k: v for k, v in cells.items() if k != every})
    middle = list(range(n_sup, cells[bert].task.n_vars - 1))  # unsupervised in both (b) models
    middle_acc = {n: round(float(np.mean([acc[i] for i in middle])), 4) for n, acc in table.items()} if middle else {}
    headline = {"learned_step_all_supervised": steps, "last_learned_before_middle": shortcut,
                "reached_75_step": steps_75, "last_reached_75_before_middle": shortcut_75,
                "final_acc_all_supervised": metrics[-1].get("acc_per_var") if metrics else None,
                "middle_acc": middle_acc, **{k: evidence[k] for k in ("probe_first_layer",) if k in evidence}}
    sections = [
        ("(a) Trained on every variable: learning order",
         curves_html(ctx, all_name, cells[every], "all supervised") + table_html(
             [["step reaching 95%", *steps], ["step reaching 75%", *steps_75]], ["", *[f"#{i}" for i in range(n_vars)]])
         + f"<p class='verdict'>last variable learned (95%) before the middle ones: {shortcut}; "
           f"reached 75% before them: {shortcut_75}</p>"),
        ("(a) How the last variable is computed", last_variable_evidence_html(evidence)),
        ("(b) #0..#k-2 plus the last vs #0..#k-1",
         table_html(rows, ["model", *[f"#{i}" for i in range(cells[bert].task.n_vars)]])
         + f"<p>Mean accuracy on the middle variables {middle} (unsupervised in both): {middle_acc}.</p>"
         + (f"<p>Both models are the last stage of the <code>{curriculum(ctx.scale, 'bert').name}</code> curriculum "
            "on the same earlier stages (which supervised their own variables, see RESULTS.md); they differ in what "
            "the last stage supervises only, so this compares fine-tunes of one trunk, not models "
            "trained from scratch.</p>" if curriculum(ctx.scale, "bert") else "")
         + "".join(curves_html(ctx, cell.name, c, cell.name) for cell, c in cells.items() if cell.name in table)),
    ]
    rules = _rules_of(ctx, [cell.name for cell in cells if finished(pool_dir(ctx) / cell.name)])
    if rules:
        sections.append(parity_rules_section(rules))
    return finish(ctx, "LEGO: the shortcut", sections,
                  {"final_acc": table, "evidence": evidence,
                   "parity_rules": rules, "headline": headline})


def heads_study(ctx: StudyContext) -> dict[str, Any]:
    """Finding 5: head labels of every trained model in the pool, and the heads the answer depends on."""
    train_pool(ctx, dict(plan(ctx, kind, seed) for kind in ("bert", "albert") for seed in seeds(ctx, pairs=True)))
    names = sorted(p.name for p in pool_dir(ctx).iterdir() if finished(p))  # not one still training
    rows, per_model, counts = [], {}, {"association": 0, "manipulation": 0}
    for name in names:
        run = load_run(pool_dir(ctx) / name)
        if run.config.task.name != "lego":
            continue
        tokens = run.task.sample(256, seeded_generator(0), split="test").tokens
        heads = classify_heads(run.model, run.task, tokens)
        planted = set(run.config.model.planted)
        learned = {f"L{layer}H{head}": label for layer, row in enumerate(heads.labels) for head, label in enumerate(row)
                   if f"{layer}.{head}" not in planted and f"*.{head}" not in planted}
        clean, corrupted, slot, description = counterfactual_pairs(run.task, 64, 3, run.model)
        patch = patch_head_out(run.model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, slot))
        effects = {f"L{layer}H{head}": round(v, 3)
                   for layer, row in enumerate(patch.values.tolist()) for head, v in enumerate(row)}
        top = sorted(effects.items(), key=lambda kv: -abs(kv[1]))[:3]
        extrapolating = extrapolates(run)
        per_model[name] = {"learned_labels": learned, "planted": run.config.model.planted,
                           "patching_metric": description,
                           "head_effects": effects, "top_heads": top, "extrapolates": extrapolating,
                           "scores": heads.to_dict()["scores"]}
        if extrapolating:
            for label in counts:
                counts[label] += sum(v == label for v in learned.values())
        found = ", ".join(f"{h} {lab}" for h, lab in learned.items() if lab != "mixed") or "none"
        rows.append([name, found,
                     ", ".join(f"{h} ({v:+.2f}{' planted' if _is_planted(h, planted) else ''})" for h, v in top),
                     "yes" if extrapolating else "no"])
    sections = [("Head labels and the heads the answer depends on", table_html(
        rows, ["model", "learned heads with a label (planted excluded)", "top heads by exact patching", "extrapolates"])
        + "<p>Patching: clean head output into the corrupted run, metric at the deepest fitted supervised variable; "
          "1 = restores the clean answer. A model extrapolates when its first unsupervised variable is >= 60%.</p>")]
    for name, data in per_model.items():
        sections.append((f"Head scores: {name}", figure_html(
            plots.head_score_heatmaps(data["scores"],
                                      [["" for _ in row] for row in data["scores"]["association"]]), name)))
    return finish(ctx, "LEGO: attention heads", sections,
                  {"models": per_model,
                   "headline": {"learned_labels_in_extrapolating_models": counts,
                                "extrapolating": [n for n, d in per_model.items() if d["extrapolates"]]}})


def _is_planted(head: str, planted: set[str]) -> bool:
    layer, head_index = head[1:].split("H")
    return f"{layer}.{head_index}" in planted or f"*.{head_index}" in planted


def s3_study(ctx: StudyContext) -> dict[str, Any]:
    """Task 2 (the non-abelian S3): the BERT vs ALBERT comparison repeated."""
    return extrapolation_study(ctx, group="s3")


STUDIES = [
    Study("lego-extrapolation", "BERT vs ALBERT: train on the first k variables, test all (Fig. 3)",
          extrapolation_study),
    Study("lego-percolation", "probe map (layer x chain depth), slope and linearity, BERT vs ALBERT (Fig. 4)",
          percolation_study),
    Study("lego-stochastic-depth", "ALBERT with stochastic depth vs fixed depth (Fig. 5)", stochastic_depth_study),
    Study("lego-mimic", "mimicking initialisation vs random init (Fig. 6)", mimic_study),
    Study("lego-shortcut", "last variable learned first; first k-1 + last vs first k supervision", shortcut_study),
    Study("lego-heads", "head labels of every trained model and the heads the answer depends on", heads_study),
    Study("lego-hardcoded", "hardcoded association/manipulation/broadcast heads, alone and hybrid, vs standard",
          hardcoded_study),
    Study("lego-s3", "BERT vs ALBERT on the non-abelian S3 task", s3_study),
]
