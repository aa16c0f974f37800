"""One trained run, looked into: head scores and labels, exact and attribution patching on the
task's own counterfactual pairs, then the task's own steps (probes, solution verdict) from the
registry `TASK_ANALYSES`. `analyze_run` returns a `RunAnalysis`; `write_analysis` writes it as
analysis.json; `analysis_sections` turns it into report sections.

Adding a task: one file in `tasks/` implementing `tasks.Task`, and one `TaskAnalysis` entry here."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
from transformer_lens import HookedTransformer

from interp import plots
from interp.atp import Judged, judge_estimates
from interp.attention import classify_heads
from interp.circuit import chains_to_logits, circuit_svg, find_circuit, loop_steps
from interp.patching import logit_diff_metric, patch_head_out, patch_residual
from interp.paths import check_path_patchable, path_patch
from interp.probes import composite_probe_map, lego_probe_map, percolation_summary
from interp.report import Report, figure_html, table_html
from interp.solutions import (
    ParityRule,
    composite_verdict,
    lego_parity_rules,
    lego_verdict,
    predictions,
    templates_verdict,
)
from models.runs import ANALYSIS, LoadedRun, RunFolderError
from tasks import Batch, Task, seeded_generator

MIN_METRIC_GAP = 0.5  # logits; below it normalised patching values are dominated by noise
FITTED_ACCURACY = 0.9  # the patching metric reads the deepest supervised variable at least this accurate
GOOD_AGREEMENT = 0.8  # Spearman of attribution with exact patching from which the report calls the rankings in agreement


@dataclass
class RunAnalysis:
    """What `workbench analyze` found in one run; `to_dict` is analysis.json."""

    run: str
    task: str
    heads: dict[str, Any]  # interp.attention.HeadClassification.to_dict(), plus "planted"
    patching: dict[str, Any]  # see patching_analysis
    probes: dict[str, Any] | None  # the task's probe map; None where the task has none
    verdict: dict[str, Any]  # the task's verdict
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunAnalysis:
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and f.name != "probes"]
        if missing:
            raise ValueError(f"analysis.json lacks {missing}; run `workbench analyze` again")
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class TaskAnalysis:
    """The task-specific steps of `workbench analyze` and of the run report.

    findings(run, seed) -> (probe map or None, verdict), both JSON-ready;
    circuit_findings(circuit, heads) -> what the verdict adds from the circuit graph;
    headline(verdict) -> the one line `workbench analyze` prints;
    verdict_html, probes_html -> report sections; curves(run) -> the training-curve figure."""

    findings: Callable[[LoadedRun, int], tuple[dict[str, Any] | None, dict[str, Any]]]
    headline: Callable[[dict[str, Any]], str]
    verdict_html: Callable[[dict[str, Any]], str]
    probes_html: Callable[[dict[str, Any]], str] | None
    curves: Callable[[LoadedRun], plt.Figure]
    curves_caption: str
    circuit_findings: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None


def task_analysis(name: str) -> TaskAnalysis:
    if name not in TASK_ANALYSES:
        raise ValueError(f"no analysis is registered for task {name!r}; known: {sorted(TASK_ANALYSES)}")
    return TASK_ANALYSES[name]


def counterfactual_pairs(
    task: Task, n: int, seed: int, model: HookedTransformer | None = None
) -> tuple[Batch, Batch, int, str]:
    """Aligned clean/corrupted pairs (the task's `counterfactual_pairs`), the label slot the
    metric reads, and what was changed. The slot is the deepest supervised one the model gets
    right (>= 90% on these inputs); the deepest supervised one when none is, or without a model."""
    clean, corrupted, description = task.counterfactual_pairs(n, seeded_generator(seed), aligned=True)
    slot = _deepest_fitted_slot(model, clean, task.supervised_slots())
    where = f"variable {task.label_names[slot]}" if len(task.label_names) > 1 else "the last position"
    return clean, corrupted, slot, f"{description}; metric at {where}"


def _deepest_fitted_slot(model: HookedTransformer | None, batch: Batch, supervised_slots: list[bool]) -> int:
    supervised = [slot for slot, s in enumerate(supervised_slots) if s]
    if model is None:
        return supervised[-1]
    accuracy = (predictions(model, batch) == batch.labels).float().mean(0)
    fitted = [slot for slot in supervised if accuracy[slot] >= FITTED_ACCURACY]
    return (fitted or supervised)[-1]


def patching_analysis(run: LoadedRun, n_pairs: int = 64, seed: int = 0) -> dict[str, Any]:
    clean, corrupted, slot, description = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    metric = logit_diff_metric(clean, corrupted, label_index=slot)
    device = next(run.model.parameters()).device
    args = (run.model, clean.tokens.to(device), corrupted.tokens.to(device), metric)
    heads = patch_head_out(*args)
    # per head: plain attribution, GradDrop and 4-step IG, judged against the exact sweep
    judged = judge_estimates(*args, "head", heads, ig_steps=4)
    attribution, agreement = judged["atp"].estimate, judged["atp"].spearman
    return {
        "pairs": description, "n_pairs": len(clean),
        "tokens": run.task.token_strings(clean.tokens[0]),
        "residual": patch_residual(*args).to_dict(),
        "heads": heads.to_dict(),
        "heads_attribution": attribution.to_dict(),
        # how far to trust the estimate on this run (README, Known limits); None when a sweep is constant
        "heads_attribution_spearman": agreement if math.isfinite(agreement) else None,
        "heads_attribution_verified": _verified(judged["atp"]),
        "heads_estimates_verified": {name: _verified(one, with_spearman=True) for name, one in judged.items()},
        "paths": _paths_summary(*args, heads),
    }


def _paths_summary(model: HookedTransformer, clean: Any, corrupted: Any, metric: Any, heads: Any,
                   k: int = 12) -> dict[str, Any]:
    """Path patching's strongest edges (interp/paths.py) and the circuit they draw between the
    fewest heads that keep 90% of the behaviour (interp/circuit.py); or why paths do not apply."""
    try:
        check_path_patchable(model)
        refused = None
    except ValueError as err:
        refused = str(err)
    result = None if refused else path_patch(model, clean, corrupted, metric)
    circuit = find_circuit(model, clean, corrupted, metric, heads.values, result)
    strongest = [[s, r, round(v, 4)] for s, r, v in result.strongest(k)] if result else []
    return {"strongest": strongest, "refused": refused, "circuit": circuit.to_dict()}


def analyze_run(
    run: LoadedRun, n_samples: int = 512, seed: int = 0, device: str | torch.device | None = None
) -> RunAnalysis:
    """Everything the report shows. `device`: where the model runs (it is moved there, and every
    step moves the batches it samples on the CPU to it); None: where `run.model` already is
    (`load_run(..., device)`). The result holds plain Python values whatever the device."""
    if device is not None:
        run.model.to(device, print_details=False)
    started = time.perf_counter()
    steps = task_analysis(run.config.task.name)
    tokens = run.task.sample(n_samples, seeded_generator(seed), split="test").tokens
    heads = classify_heads(run.model, run.task, tokens).to_dict()
    heads["planted"] = run.config.model.planted  # hardcoded heads, not learned
    patching = patching_analysis(run, seed=seed)
    probes, verdict = steps.findings(run, seed)
    circuit = patching["paths"].get("circuit")
    if circuit is not None and steps.circuit_findings is not None:
        verdict.update(steps.circuit_findings(circuit, heads))
    return RunAnalysis(str(run.path), run.config.task.name, heads, patching, probes, verdict,
                       round(time.perf_counter() - started, 2))


def _lego_findings(run: LoadedRun, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    probes = lego_probe_map(run.model, run.task, seed=seed)
    verdict = lego_verdict(run.model, run.task, run.metrics, seed=seed).to_dict()
    verdict["findings"] += _percolation_findings(probes.first_layer)
    if run.task.cfg.group == "z2":
        rules = lego_parity_rules(run.model, run.task, seed=seed)
        verdict["parity_rules"] = [r.summary() for r in rules]
        verdict["findings"] += _rule_findings(rules)
    return probes.to_dict(), verdict


def _composite_findings(run: LoadedRun, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    probes = composite_probe_map(run.model, run.task, seed=seed)
    return probes.to_dict(), composite_verdict(run.model, run.task, seed=seed).to_dict()


def _templates_findings(run: LoadedRun, seed: int) -> tuple[None, dict[str, Any]]:
    return None, templates_verdict(run.model, run.task, seed=seed).to_dict()


def _head_labels(heads: dict[str, Any]) -> dict[str, str]:
    """"L1H0" -> its label."""
    return {f"L{layer}H{head}": label for layer, row in enumerate(heads["labels"]) for head, label in enumerate(row)}


def _named_chain(chain: list[str], heads: dict[str, Any]) -> str:
    """`L1H0 (manipulation) -> L2H0 (association, planted) -> logits`."""
    labels = _head_labels(heads)
    planted = {"L{}H{}".format(*key.split(".")) for key in (heads.get("planted") or {})}
    return " -> ".join(node if node == "logits" else f"{node} ({labels.get(node, '?')}{', planted' * (node in planted)})"
                       for node in chain)


def _lego_circuit_findings(circuit: dict[str, Any], heads: dict[str, Any]) -> dict[str, Any]:
    """For-loop evidence from the circuit graph: a path to the logits on which an association
    head feeds a manipulation head in the next layer, or the other way round."""
    labels = _head_labels(heads)
    chains = chains_to_logits(circuit)
    looping = [(chain, steps) for chain in chains if (steps := loop_steps(chain, labels))]
    if looping:
        chain, steps = looping[0]
        line = (f"circuit: {len(steps)} for-loop step(s), association and manipulation heads in consecutive layers on "
                f"a path to the logits: {_named_chain(chain, heads)}")
    elif chains:
        chain = chains[0]
        line = (f"circuit: no path to the logits passes from an association head to a manipulation head in the next "
                f"layer or back; longest path: {_named_chain(chain, heads)}")
    else:
        chain, line = [], "circuit: no path patching edge of the circuit reaches the logits"
    return {"circuit_chain": chain, "findings_from_circuit": [line]}


def _composite_circuit_findings(circuit: dict[str, Any], heads: dict[str, Any]) -> dict[str, Any]:
    """The route to the answer: the circuit's longest path to the logits."""
    chains = chains_to_logits(circuit)
    return {"route": _named_chain(chains[0], heads) if chains else "no circuit edge reaches the logits"}


def _rule_findings(rules: list[ParityRule]) -> list[str]:
    """One line naming the variables whose answers follow another parity than the chain's."""
    other = [f"#{r.variable} {r.describe()} ({r.agreement:.2f})" for r in rules if not r.is_true_rule]
    if not other:
        return ["every variable's answers follow its chain parity x0 + g0 + ... + gk"]
    return ["answers follow another parity than the chain (x0 + g0 + ... + gk) on " + ", ".join(other)]


def _percolation_findings(first: list[int | None]) -> list[str]:
    return [f"probes: {percolation_summary(first)}; first layer reaching 95% per depth {first}"]


def write_analysis(run: LoadedRun, analysis: RunAnalysis) -> Path:
    path = run.path / ANALYSIS
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(analysis.to_dict(), indent=1))
    tmp.replace(path)
    return path


def read_analysis(run_dir: Path) -> RunAnalysis | None:
    """The run's analysis.json, or None where it has none; RunFolderError naming the file and what
    is wrong where it is not JSON or not an analysis."""
    path = Path(run_dir) / ANALYSIS
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunFolderError(f"{path} is not JSON ({err}); run `workbench analyze {run_dir}` again") from None
    problem = _analysis_problem(data)
    if problem:
        raise RunFolderError(f"{path} {problem}; run `workbench analyze {run_dir}` again")
    return RunAnalysis.from_dict({**data, "seconds": float(data["seconds"])})


ANALYSIS_FIELDS = {"run": (str, "a string"), "task": (str, "a string"), "heads": (dict, "an object"),
                   "patching": (dict, "an object"), "probes": ((dict, type(None)), "an object or null"),
                   "verdict": (dict, "an object"), "seconds": ((int, float), "a number")}


def _analysis_problem(data: Any) -> str | None:
    """What keeps `data` from being an analysis.json (its top level), or None."""
    if not isinstance(data, dict):
        return f"is not a JSON object but {type(data).__name__}"
    missing = [name for name in ANALYSIS_FIELDS if name not in data and name != "probes"]
    if missing:
        return f"lacks {missing}"
    wrong = [f"{name} must be {kind}" for name, (types, kind) in ANALYSIS_FIELDS.items() if not isinstance(data.get(name), types)]
    if wrong:
        return f"holds fields of the wrong kind ({'; '.join(wrong)})"
    if data["task"] not in TASK_ANALYSES:
        return f"names task={data['task']!r}, which is unknown; known: {sorted(TASK_ANALYSES)}"
    return None


def analysis_sections(report: Report, analysis: RunAnalysis) -> None:
    """Verdict, heads, patching and probes, appended to `report`."""
    steps = task_analysis(analysis.task)
    report.add("Verdict", steps.verdict_html(analysis.verdict))
    heads = analysis.heads
    planted = heads.get("planted") or {}
    listed = ", ".join(f"{_head_name(where)} {kind}" for where, kind in planted.items())
    note = f"<p>Planted (hardcoded, not learned) heads: {html.escape(listed)}.</p>" if planted else ""
    report.add("Attention heads", note + figure_html(plots.head_score_heatmaps(heads["scores"], heads["labels"]),
               "Score per kind (0 = uniform attention, 1 = all mass on the kind's targets); * marks each head's label.")
               + table_html([[f"L{i}", *row] for i, row in enumerate(heads["labels"])], ["layer", *[f"H{h}" for h in range(len(heads["labels"][0]))]]))
    report.add("Activation patching", _patching_html(analysis.patching))
    if "paths" in analysis.patching:  # analyses written before path patching lack it
        report.add("Path patching", _paths_html(analysis.patching["paths"], heads["labels"]))
        if "circuit" in analysis.patching["paths"]:
            report.add("Circuit", _circuit_html(analysis.patching["paths"]["circuit"], heads["labels"]))
    if steps.probes_html is not None and analysis.probes is not None:
        report.add("Probes", steps.probes_html(analysis.probes))


def _head_name(where: str) -> str:
    """`"1.0"` -> `"L1H0"` (`"*.0"` -> `"L*H0"`)."""
    layer, _, head = where.partition(".")
    return f"L{layer}H{head}"


def _table_verdict_html(verdict: dict[str, Any]) -> str:
    """Composite and templates: the solution's name, then its evidence."""
    head = f"<p class='verdict'>Solution: {html.escape(verdict['verdict'])}</p>"
    rows = [[k, json.dumps(v)] for k, v in verdict.items() if k != "verdict"]
    return head + table_html(rows, ["evidence", "value"])


def _lego_verdict_html(verdict: dict[str, Any]) -> str:
    lines = verdict["findings"] + verdict.get("findings_from_circuit", [])
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    rules = verdict.get("parity_rules")  # Z2 only
    rows = [[f"#{i}", a, "yes" if s else "no", verdict["learned_step"][i],
             *([f"{rules[i]['rule']} ({rules[i]['agreement']:.2f})"] if rules else [])]
            for i, (a, s) in enumerate(zip(verdict["acc_per_var"], verdict["supervised"]))]
    header = ["variable", "test accuracy", "supervised", "learned at step", *(["closest parity rule"] if rules else [])]
    return f"<ul>{items}</ul>" + table_html(rows, header)


def _patching_html(patching: dict[str, Any]) -> str:
    resid, heads, attribution = patching["residual"], patching["heads"], patching["heads_attribution"]
    parts = [f"<p>Counterfactual pairs: {html.escape(patching['pairs'])} ({html.escape(str(patching['n_pairs']))} pairs, one shared "
             f"layout). Values are normalised: 0 = corrupted behaviour, 1 = clean (logit difference "
             f"{resid['clean_metric']:.2f} clean vs {resid['corrupted_metric']:.2f} corrupted).</p>"]
    if abs(resid["clean_metric"] - resid["corrupted_metric"]) < MIN_METRIC_GAP:
        parts.append("<p><strong>Warning:</strong> the model barely tells clean from corrupted inputs apart, so the "
                     "normalised values below divide by a near-zero gap and mean little.</p>")
    parts.append(figure_html(plots.heatmap(resid["values"], "position", "layer", "residual stream (clean -> corrupted)",
                                           patching["tokens"], -1.0, 1.0), "Exact patching of the residual stream at each layer and position."))
    parts.append(figure_html(plots.heatmap(heads["values"], "head", "layer", "head outputs, exact", None, -1.0, 1.0),
                             "Exact patching of each head's output at all positions."))
    parts.append(figure_html(plots.heatmap(attribution["values"], "head", "layer", "head outputs, attribution", None, -1.0, 1.0),
                             "Attribution patching (first-order estimate) of the same cells. " + _agreement_note(patching)))
    return "".join(parts)


def _paths_html(paths: dict[str, Any], labels: list[list[str]]) -> str:
    if paths.get("refused"):
        return f"<p>Not computed: {html.escape(str(paths['refused']))}.</p>"

    def named(head: str) -> str:  # "L1H0" or "L1H0.v" -> with the head's label
        name, _, port = str(head).partition(".")
        layer, _, index = name[1:].partition("H")
        try:
            kind = labels[int(layer)][int(index)]
        except (ValueError, IndexError):
            return str(head)
        return f"{name} ({kind}){'.' + port if port else ''}"

    rows = [[named(sender), named(receiver), value] for sender, receiver, value in paths["strongest"]]
    return ("<p>The strongest paths, on the same pairs and metric: a sender head's output changed to the clean "
            "run's along one path only (every other head and MLP frozen), into a later head's query, key or value "
            "input, or directly to the logits. Normalised like exact patching.</p>"
            + table_html(rows, ["sender", "receiver", "value"]))


def _circuit_html(circuit: dict[str, Any], labels: list[list[str]]) -> str:
    n_layers, n_heads = len(labels), len(labels[0])
    kept, total = len(circuit["nodes"]), n_layers * n_heads
    verdict = (f"{kept} of {total} heads keep {circuit['faithfulness']:.2f} of the behaviour (target "
               f"{circuit['target']:.2f})" if circuit["reached"] else
               f"no set of heads reaches the target {circuit['target']:.2f}: with all {total} kept, "
               f"{circuit['faithfulness']:.2f} (the rest is carried by MLPs and embeddings on the clean input)")
    curve = ", ".join(f"{k}: {value:.2f}" for k, value in enumerate(circuit["curve"]))
    mean = circuit.get("faithfulness_mean")  # absent from analysis.json files written before it existed
    cross = (f" The same heads with every other head mean-ablated instead (its mean output per position): "
             f"{mean:.2f}." if isinstance(mean, (int, float)) else "")
    return (f"<p>{html.escape(verdict)}. Every other head is resample-ablated (its output taken from the paired "
            f"corrupted input); heads join by |exact patching effect|.{html.escape(cross)} "
            f"{html.escape(_edges_sentence(circuit))}</p>" + circuit_svg(circuit, n_layers, n_heads, labels)
            + f"<p>Faithfulness with the first k heads: {html.escape(curve)}.</p>")


def _edges_sentence(circuit: dict[str, Any]) -> str:
    """How the drawn edges were chosen, and what they keep."""
    if circuit.get("edge_faithfulness") is None:  # path patching refused the model, or an older analysis.json
        if circuit.get("edges"):
            return "Edges: path patching between kept heads and to the logits, drawn where |value| >= 0.05, not ablated."
        return ("No edges: no head is kept." if not circuit.get("nodes") else
                "No edges: path patching does not apply to this model.")
    return (f"Edges: {len(circuit['edges'])} of the {circuit['candidate_edges']} edges among the kept heads (a head's "
            f"output into a later kept head's query, key or value, or into the logits directly), left after dropping "
            f"edges, weakest path patching effect first, while the faithfulness stays at the target; with only "
            f"these edges the heads keep {circuit['edge_faithfulness']:.2f} ({circuit['edge_faithfulness_mean']:.2f} "
            f"under mean ablation), with none of them {circuit['no_edge_faithfulness']:.2f}. Paths through MLPs are "
            f"not edges: MLPs read the residual stream as it flows. Each edge is labelled with its path patching "
            f"effect.")


def _verified(judged: Judged, k: int = 3, with_spearman: bool = False) -> dict[str, Any] | None:
    """AtP*'s yardstick: heads verified in the estimate's order until exact's top k are found (of
    all heads), and with_spearman its Spearman with exact (None where undefined); None when no head
    changes the metric or the estimate is not finite."""
    if judged.verified is None:
        return None
    found: dict[str, Any] = {"k": min(k, judged.n_cells), "heads": judged.verified, "of": judged.n_cells}
    if with_spearman:
        found["spearman"] = judged.spearman if math.isfinite(judged.spearman) else None
    return found


ESTIMATE_NAMES = {"atp": "attribution", "graddrop": "GradDrop", "ig4": "integrated gradients (4 steps)"}


def _estimates_cost(patching: dict[str, Any]) -> str:
    """AtP*'s yardstick for each per-head estimate, and where the rest is measured."""
    judged = {name: one for name, one in patching.get("heads_estimates_verified", {}).items() if one}
    if not judged:  # an analysis written before it, or nothing to find
        return ""
    one = next(iter(judged.values()))
    costs = ", ".join(f"{ESTIMATE_NAMES.get(name, name)} {found['heads']} (Spearman "
                      + ("undefined" if found["spearman"] is None else f"{found['spearman']:.2f}") + ")"
                      for name, found in judged.items())
    return (f" Heads verified in each estimate's order until exact's top {one['k']} are found, of {one['of']}: "
            f"{costs}. For head x position cells and the QK fix on queries and keys, side by side: "
            f"`workbench benchmark --patching RUN`.")


def _agreement_note(patching: dict[str, Any]) -> str:
    if "heads_attribution_spearman" not in patching:  # an analysis written before it
        return ""
    agreement = patching["heads_attribution_spearman"]
    if agreement is None:
        return "Its agreement with exact patching is undefined: one of the two maps is constant."
    verified = patching.get("heads_attribution_verified")
    cost = ("" if not verified else f" Patching heads exactly in attribution's order finds exact's top {verified['k']} "
            f"after {verified['heads']} of {verified['of']} heads (AtP*'s yardstick).") + _estimates_cost(patching)
    gap = abs(patching["heads"]["clean_metric"] - patching["heads"]["corrupted_metric"])
    if gap < MIN_METRIC_GAP:
        return f"Spearman correlation with exact: {agreement:.2f}, of little meaning here (see the warning above).{cost}"
    trust = ("Its ranking broadly agrees with exact patching." if agreement >= GOOD_AGREEMENT
             else "Its ranking differs from exact patching here: read the exact map, and use attribution only "
                  "to screen (README, Known limits).")
    exact, estimate = (_largest_heads(patching[key]) for key in ("heads", "heads_attribution"))
    listed = "; ".join(f"{label}: " + ", ".join(f"{name} {value:.2f}" for name, value in heads)
                       for label, heads in (("exact", exact), ("attribution", estimate)))
    return f"Spearman correlation with exact: {agreement:.2f}. {trust} Largest effects, {listed}.{cost}"


def _largest_heads(sweep: dict[str, Any], k: int = 3) -> list[tuple[str, float]]:
    """The k heads of a per-head sweep with the largest |value|, as ("L1H2", value)."""
    cells = [(f"L{layer}H{head}", value) for layer, row in zip(sweep["layers"], sweep["values"])
             for head, value in enumerate(row)]
    return sorted(cells, key=lambda cell: -abs(cell[1]))[:k]


def _lego_probes_html(probes: dict[str, Any]) -> str:
    fig = plots.heatmap(probes["accuracy"], "chain depth", "layer", "probe accuracy", probes["depth_names"], 0.0, 1.0, "viridis")
    note = (f"Chance {probes['chance']:.2f}. First layer reaching {probes['threshold']:.0%} per depth: "
            f"{probes['first_layer']}; {percolation_summary(probes['first_layer'])}.")
    return figure_html(fig, "Linear probe accuracy for each variable's value at its own token.") + f"<p>{html.escape(note)}</p>"


def _composite_probes_html(probes: dict[str, Any]) -> str:
    rows = []
    for site_index, site in enumerate(probes["site_names"]):
        for quantity_index, quantity in enumerate(probes["quantity_names"]):
            rows.append([site, quantity, *[round(layer[site_index][quantity_index], 3) for layer in probes["accuracy"]]])
    header = ["site", "quantity", *probes["layer_names"]]
    return "<p>Linear probe accuracy per layer.</p>" + table_html(rows, header)


def _lego_curves(run: LoadedRun) -> plt.Figure:
    return plots.lego_curves(run.metrics, run.task.supervised_slots())


TASK_ANALYSES: dict[str, TaskAnalysis] = {
    "lego": TaskAnalysis(
        _lego_findings, lambda verdict: json.dumps(verdict["findings"]), _lego_verdict_html, _lego_probes_html,
        _lego_curves, "Solid: supervised variables; dashed: not supervised (extrapolation).", _lego_circuit_findings),
    "composite": TaskAnalysis(
        _composite_findings, lambda verdict: verdict["verdict"], _table_verdict_html, _composite_probes_html,
        lambda run: plots.composite_curves(run.metrics),
        "Seen-pair accuracy on test keys, and the answers on the held-out pair.", _composite_circuit_findings),
    "templates": TaskAnalysis(
        _templates_findings, lambda verdict: f"{verdict['verdict']} (accuracy per symbol split {verdict['accuracy']})",
        _table_verdict_html, None, lambda run: plots.templates_curves(run.metrics),
        "Accuracy on strings of test symbols, never seen in training."),
}
