"""LEGO's analysis as `workbench analyze` runs it: the findings (the verdict, `lego_verdict.py`;
the probe map of information percolation, `lego_probes.py`), the for-loop evidence of the
circuit graph, and the report's sections and curves: `LegoAnalysis`, at the end of the file,
which interp/tasks/__init__.py lists. Also what the LEGO studies
(analyses/studies/lego.py) read from one model: how its last variable is computed (the shortcut),
and their figures and tables. Why a model sits on the #2 plateau (analyses/research/plateau.py) is
`lego_plateau.py`'s; the presets and curricula are `lego_presets.py`'s.

Shape glossary: layer = residual streams (interp.probes), depth = LEGO chain index, label = one
slot per variable in chain order.
"""

from __future__ import annotations

import dataclasses
import html
import json
from typing import Any

import matplotlib.pyplot as plt
import torch
from transformer_lens import HookedTransformer

from interp import plots
from interp.attention import attention_patterns, mass_on_keys
from interp.circuit import Circuit, chains_to_logits, loop_steps
from interp.head_evidence import ShareProbe
from interp.patching import logit_diff_metric, patch_head_out
from interp.report import figure_html, table_html
from interp.report_format import or_never, rate
from interp.task_analysis import TaskAnalysis, named_chain
from interp.tasks.lego_heads import lego_share_probe
from interp.tasks.lego_probes import ProbeMap, lego_probe_map, percolation_findings, percolation_summary
from interp.tasks.lego_verdict import (
    LegoVerdict,
    lego_parity_rules,
    lego_summary,
    lego_timeline_panels,
    lego_verdict,
    lego_verdict_label,
    lego_verdict_rates,
    rule_findings,
)
from models.runs import LoadedRun
from models.shapes import Grid, Many, Maybe, OrNone
from tasks import LegoTask, seeded_generator

# ---------------------------------------------------------------------------------------------
# How the last variable is computed: the shortcut's evidence (`workbench study lego-shortcut`)


def last_variable_evidence(model: HookedTransformer, task: LegoTask, n_train: int, n_test: int) -> dict[str, Any]:
    """Probes per depth (is the last variable readable earlier than the middle ones?), head
    patching at the last slot and at #1 (which heads carry it?), and each head's attention mass
    from those slots to the group-element tokens. Probes fit on `n_train` sentences, score on
    `n_test`."""
    probe = lego_probe_map(model, task, n_train=n_train, n_test=n_test)
    gen = seeded_generator(7)
    clean = task.sample(64, gen, split="test", aligned=True)
    n_vars = task.cfg.n_vars
    patches = {}
    for depth, slot in ((0, n_vars - 1), (0, 1)):
        corrupted, _ = task.corrupt(clean, gen, depth=depth)
        result = patch_head_out(model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, slot))
        patches[f"#{slot}"] = [[round(v, 3) for v in row] for row in result.values.tolist()]
    # a parity shortcut reads the group elements (the signs) of every clause from the last
    # variable's token; following the chain reads them one clause at a time
    signs = (clean.tokens >= task.first_element) & (clean.tokens < task.first_value)
    with torch.no_grad():
        patterns = attention_patterns(model, clean.tokens)
    sign_mass = {}
    for slot in (n_vars - 1, 1):
        mass, baseline = mass_on_keys(patterns, clean.label_pos[:, slot], signs)
        sign_mass[f"#{slot}"] = [[round(v, 3) for v in row] for row in mass.tolist()]
    return {"probe_accuracy": probe.to_dict()["accuracy"], "probe_first_layer": probe.first_layer,
            "depth_names": probe.depth_names, "head_patching": patches, "sign_attention": sign_mass,
            "sign_attention_uniform": round(baseline, 3)}


def last_variable_evidence_html(evidence: dict[str, Any]) -> str:
    """The report section of `last_variable_evidence` (empty evidence: the model did not train)."""
    if not evidence:
        return "<p>No evidence: the model did not train.</p>"
    parts = [figure_html(plots.heatmap(evidence["probe_accuracy"], "chain depth", "layer", "probe accuracy",
                                       evidence["depth_names"], vmin=0.5, vmax=1.0, cmap="viridis"),
                         "First layer reaching 95% per depth: "
                         f"{', '.join(map(or_never, evidence['probe_first_layer']))}. A last variable readable before "
                         "the middle ones points to a shortcut rather than following the chain.")]
    for slot, values in evidence["head_patching"].items():
        parts.append(figure_html(plots.heatmap(values, "head", "layer", f"head-output patching, metric at {slot}",
                                               vmin=-1.0, vmax=1.0),
                                 f"Clean head output patched into the corrupted run (root flipped); 1 = restores the "
                                 f"clean answer at {slot}."))
    for slot, values in evidence.get("sign_attention", {}).items():
        parts.append(figure_html(plots.heatmap(values, "head", "layer", f"attention from {slot} to group elements",
                                               vmin=0.0, vmax=1.0, cmap="viridis"),
                                 f"Mean attention mass from variable {slot}'s token to the group-element (sign) tokens "
                                 f"of all clauses; uniform attention gives {evidence['sign_attention_uniform']}."))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# workbench analyze and the report


def lego_findings(run: LoadedRun, seed: int) -> tuple[ProbeMap, LegoVerdict]:
    probes = lego_probe_map(run.model, run.task, seed=seed)
    verdict = lego_verdict(run.model, run.task, run.metrics, seed=seed)
    verdict.findings += percolation_findings(probes.first_layer)
    if run.task.cfg.group == "z2":
        verdict.parity_rules = lego_parity_rules(run.model, run.task, seed=seed)
        verdict.findings += rule_findings(verdict.parity_rules)
    return probes, verdict


def parity_rules_section(rules: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """A report section (title, html): the parity rule each model's answers follow per variable
    (`ParityRule.summary()` lists by model name), with how to read it."""
    n_vars = max(len(r) for r in rules.values())
    table = table_html(
        [[n, *[f"{r['rule']} ({r['agreement']:.2f})" for r in model_rules]] for n, model_rules in rules.items()],
        ["model", *[f"#{i}" for i in range(n_vars)]])
    how = ("<p>Per variable, the parity of root value x0 and chain elements g0, g1, ... that the model's test "
           "answers agree with most (share in brackets; <code>interp.tasks.lego.lego_parity_rules</code>). The true "
           "value of #k is x0 + g0 + ... + gk.</p>")
    return "What each model computes (parity rules)", table + how


def lego_accuracy_figure(table: dict[str, list[float]], supervised: list[bool], title: str,
                         chance: float) -> plt.Figure:
    """Final test accuracy per variable (chain order), one line per model (the paper's Figure 3 end point)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, acc in table.items():
        ax.plot(range(len(acc)), acc, marker="o", label=name)
    first_unsup = next((i for i, s in enumerate(supervised) if not s), None)
    if first_unsup is not None:
        ax.axvspan(first_unsup - 0.5, len(supervised) - 0.5, color="0.92", label="not supervised")
    ax.axhline(chance, color="0.6", linestyle=":", label="chance")
    ax.set(xlabel="variable (chain order)", ylabel="final test accuracy", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def lego_curves(metrics: list[dict[str, Any]], supervised: list[bool]) -> plt.Figure:
    """Per-variable test accuracy over training steps (solid: supervised, dashed: not), and loss."""
    records = [m for m in metrics if "acc_per_var" in m]
    steps = [m["step"] for m in records]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    per_var = list(zip(*[m["acc_per_var"] for m in records])) if records else []
    colours = plt.cm.viridis([i / max(1, len(per_var) - 1) for i in range(len(per_var))])
    for i, accs in enumerate(per_var):
        ax_acc.plot(steps, accs, color=colours[i], linestyle="-" if supervised[i] else "--", label=f"#{i}")
    ax_acc.set(xlabel="step", ylabel="test accuracy", ylim=(0.0, 1.02), title="per-variable accuracy (chain order)")
    ax_acc.legend(fontsize=7, ncol=2)
    plots.loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


# what a planted LEGO model is not, and where to look instead (analyses/lab/lego-recipes.md, "The #2 plateau")
PLANTED_NOTE = (
    "No plain LEGO model from random init has learned the association hop at this shape on CPU (26 letters, "
    "batch 128: analyses/lab/lego-recipes.md, \"The #2 plateau\"). Plain models that did learn it, nothing planted "
    "or mimicked: "
    "<code>workbench analyze zoo/lego-association</code> (six letters, batch 512, one hop; L2H3 is a learned "
    "association head) and <code>zoo/lego-three-hops</code> (a curriculum from it: n = 8, #0-#4, three hops).")


class LegoAnalysis(TaskAnalysis):
    curves_caption = "Solid: supervised variables; dashed: not supervised (extrapolation)."
    planted_note = PLANTED_NOTE
    verdict_shape = {"findings": Many(str), "findings_from_circuit": Maybe(Many(str)), "acc_per_var": Many(float),
                     "supervised": Many(bool), "learned_step": Many(OrNone(int)),
                     "parity_rules": Maybe(OrNone(Many({"rule": str, "agreement": float})))}
    probes_shape = {"accuracy": Grid(float), "depth_names": Many(str), "chance": float, "threshold": float,
                    "first_layer": Many(OrNone(int))}

    def findings(self, run: LoadedRun, seed: int) -> tuple[ProbeMap, LegoVerdict]:
        return lego_findings(run, seed)

    def headline(self, verdict: LegoVerdict) -> str:
        return json.dumps(verdict.findings)

    def verdict_html(self, verdict: dict[str, Any]) -> str:
        lines = verdict["findings"] + verdict.get("findings_from_circuit", [])
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        rules = verdict.get("parity_rules")  # Z2 only
        rows = [[f"#{i}", rate(a), "yes" if s else "no", or_never(step)]
                for i, (a, s, step) in enumerate(zip(verdict["acc_per_var"], verdict["supervised"],
                                                     verdict["learned_step"]))]
        for row, rule in zip(rows, rules or []):
            row.append(f"{rule['rule']} ({rule['agreement']:.2f})")
        header = ["variable", "test accuracy", "supervised", "learned at step",
                  *(["closest parity rule"] if rules else [])]
        return f"<ul>{items}</ul>" + table_html(rows, header)

    def probes_html(self, probes: dict[str, Any]) -> str:
        fig = plots.heatmap(probes["accuracy"], "chain depth", "layer (0: embedding, k: after block k-1)",
                            "probe accuracy", probes["depth_names"], 0.0, 1.0, "viridis")
        note = (f"Chance {probes['chance']:.2f}. First layer reaching {probes['threshold']:.0%} per depth: "
                f"{', '.join(map(or_never, probes['first_layer']))}; {percolation_summary(probes['first_layer'])}.")
        caption = "Linear probe accuracy for each variable's value at its own token."
        return figure_html(fig, caption) + f"<p>{html.escape(note)}</p>"

    def curves(self, run: LoadedRun) -> plt.Figure:
        return lego_curves(run.metrics, run.task.supervised_slots())

    def circuit_findings(self, verdict: LegoVerdict, circuit: Circuit, labels: dict[str, str],
                               planted: set[str]) -> LegoVerdict:
        """For-loop evidence from the circuit graph: a path to the logits on which an association
        head feeds a manipulation head in the next layer, or the other way round."""
        chains = chains_to_logits(circuit.edges)
        looping = [(chain, steps) for chain in chains if (steps := loop_steps(chain, labels))]
        if looping:
            chain, steps = looping[0]
            line = (f"circuit: {len(steps)} for-loop step(s), association and manipulation heads in consecutive "
                    f"layers on a path to the logits: {named_chain(chain, labels, planted)}")
        elif chains:
            chain = chains[0]
            line = (f"circuit: no path to the logits passes from an association head to a manipulation head in the "
                    f"next layer or back; longest path: {named_chain(chain, labels, planted)}")
        else:
            chain, line = [], "circuit: no path patching edge of the circuit reaches the logits"
        return dataclasses.replace(verdict, circuit_chain=chain, findings_from_circuit=[line])

    def verdict_label(self, verdict: dict[str, Any]) -> str:
        return lego_verdict_label(verdict)

    def timeline_panels(self, verdict: dict[str, Any]) -> dict[str, dict[str, float]]:
        return lego_timeline_panels(verdict)

    def summary(self, record: dict[str, Any]) -> dict[str, Any] | None:
        return lego_summary(record)

    def verdict_rates(self, verdict: dict[str, Any]) -> dict[str, float]:
        return lego_verdict_rates(verdict)

    def metric_words(self) -> dict[str, str]:
        return {"acc_per_var": "accuracy per variable, in chain order (fraction)",
                "acc_supervised": "accuracy over the supervised variables (fraction)",
                "acc_unsupervised": "accuracy over the unsupervised variables, extrapolation (fraction)"}

    def share_probe(self, run: LoadedRun, seed: int) -> ShareProbe:
        return lego_share_probe(run, seed)
