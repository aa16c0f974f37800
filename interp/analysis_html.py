"""The report's sections of one analysis, built from its written form (analysis.json)."""

from __future__ import annotations

import html
from typing import Any

from interp import plots
from interp.circuit import CIRCUIT_LEGEND, circuit_svg
from interp.circuit_spread import bootstrap_html
from interp.head_evidence import head_evidence_html
from interp.report import Report, figure_html, table_html
from interp.report_format import effect, has_rank_correlation, rank_correlation
from interp.tasks import task_analysis

MIN_METRIC_GAP = 0.5  # logits; below it normalised patching values are dominated by noise
CURVE_AS_TEXT = 13  # points of the faithfulness curve (heads + 1) listed as text; more are drawn
# Spearman of attribution with exact patching from which the report calls the rankings in agreement
GOOD_AGREEMENT = 0.8
ESTIMATE_NAMES = {"atp": "attribution", "graddrop": "GradDrop", "ig4": "integrated gradients (4 steps)"}
RULE_WORDS = {  # how the circuit's heads were chosen (interp.circuit.RULES)
    "stays": "the first prefix from which every larger one keeps the target too (two heads that cancel when "
             "ablated together cannot end it early)",
    "first": "the first prefix that reaches the target",
    "both": "the first prefix that reaches the target under resample and mean ablation alike",
}


def analysis_sections(report: Report, analysis: dict[str, Any]) -> None:
    """Verdict, heads, patching and probes, appended to `report`, from an analysis in its written
    form (`RunAnalysis.to_dict()`, or analysis.json as `read_analysis` gives it, upgraded to the
    current schema: a field older files lack is None there): one place builds the HTML, whether
    the analysis was just made or read back."""
    steps = task_analysis(analysis["task"])
    report.add("Verdict", steps.verdict_html(analysis["verdict"]))
    heads = analysis["heads"]
    planted = heads["planted"]
    listed = ", ".join(f"{_head_name(where)} {kind}" for where, kind in planted.items())
    note = f"<p>Planted (hardcoded, not learned) heads: {html.escape(listed)}.</p>" if planted else ""
    report.add("Attention heads", note + figure_html(plots.head_score_heatmaps(heads["scores"], heads["labels"]),
               "Score per kind (0 = uniform attention, 1 = all mass on the kind's targets); * marks each head's label.")
               + table_html([[f"L{i}", *row] for i, row in enumerate(heads["labels"])],
                            ["layer", *[f"H{h}" for h in range(len(heads["labels"][0]))]])
               + head_evidence_html(heads))
    patching = analysis["patching"]
    shares_on = (heads.get("evidence") or {}).get("pairs")
    other_pairs = (f"<p class='note'>The labels table above reads each head's share on other pairs "
                   f"({html.escape(shares_on)}), so a head can carry the answer there and show little here, or the "
                   "reverse.</p>" if shares_on and shares_on != patching["pairs"] else "")
    report.add("Activation patching", other_pairs + _patching_html(patching))
    paths = patching["paths"]  # None: an analysis written before path patching
    if paths is not None:
        report.add("Path patching", _paths_html(paths, heads["labels"]))
        if paths["circuit"] is not None:
            report.add("Circuit", _circuit_html(paths["circuit"], heads["labels"]))
    probes = None if analysis["probes"] is None else steps.probes_html(analysis["probes"])
    if probes is not None:
        report.add("Probes", probes)


def _head_name(where: str) -> str:
    """`"1.0"` -> `"L1H0"` (`"*.0"` -> `"L*H0"`)."""
    layer, _, head = where.partition(".")
    return f"L{layer}H{head}"


def _patching_html(patching: dict[str, Any]) -> str:
    resid, heads, attribution = patching["residual"], patching["heads"], patching["heads_attribution"]
    parts = [f"<p>Counterfactual pairs: {html.escape(patching['pairs'])} "
             f"({html.escape(str(patching['n_pairs']))} pairs, one shared layout). Values are normalised: 0 = "
             f"corrupted behaviour, 1 = clean (logit difference "
             f"{resid['clean_metric']:.2f} clean vs {resid['corrupted_metric']:.2f} corrupted).</p>"]
    if abs(resid["clean_metric"] - resid["corrupted_metric"]) < MIN_METRIC_GAP:
        parts.append("<p><strong>Warning:</strong> the model barely tells clean from corrupted inputs apart, so the "
                     "normalised values below divide by a near-zero gap and mean little.</p>")
    parts.append(figure_html(plots.heatmap(resid["values"], "position", "layer", "residual stream (clean -> corrupted)",
                                           patching["tokens"], -1.0, 1.0),
                             "Exact patching of the residual stream at each layer and position."))
    parts.append(figure_html(plots.heatmap(heads["values"], "head", "layer", "head outputs, exact", None, -1.0, 1.0),
                             "Exact patching of each head's output at all positions."))
    parts.append(figure_html(plots.heatmap(attribution["values"], "head", "layer", "head outputs, attribution", None,
                                           -1.0, 1.0),
                             "Attribution patching (first-order estimate) of the same cells. "
                             + _agreement_note(patching)))
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

    rows = [[named(sender), named(receiver), effect(value)] for sender, receiver, value in paths["strongest"]]
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
    mean = circuit["faithfulness_mean"]  # None in analysis.json files written before it existed
    cross = (f" The same heads with every other head mean-ablated instead (its mean output per position): "
             f"{mean:.2f}." if mean is not None else "")
    chosen = RULE_WORDS.get(circuit["rule"], circuit["rule"])
    return (f"<p>{html.escape(verdict)}. Every other head is resample-ablated (its output taken from the paired "
            f"corrupted input); heads join by |exact patching effect|, and the circuit is {html.escape(chosen)}."
            f"{html.escape(cross)} "
            f"{html.escape(_edges_sentence(circuit))}</p>" + circuit_svg(circuit, n_layers, n_heads, labels)
            + f"<p class='legend'>{html.escape(CIRCUIT_LEGEND)}{_no_logit_edge(circuit)}</p>"
            + _curve_html(circuit) + _areas_html(circuit["areas"]) + bootstrap_html(circuit))


def _no_logit_edge(circuit: dict[str, Any]) -> str:
    """Where no drawn edge reaches the logits, why the logits box stands alone."""
    if any(str(receiver) == "logits" for _, receiver, _ in circuit["edges"]):
        return ""
    return (" No drawn edge reaches the logits: no kept head's direct path to them is among the edges kept (how "
            "edges are kept: above).")


def _curve_html(circuit: dict[str, Any]) -> str:
    """Faithfulness with the first k heads: listed for a few heads, drawn over k beyond CURVE_AS_TEXT."""
    curve = circuit["curve"]
    if len(curve) <= CURVE_AS_TEXT:
        listed = ", ".join(f"{k}: {effect(value)}" for k, value in enumerate(curve))
        return f"<p>Faithfulness with the first k heads: {html.escape(listed)}.</p>"
    fig = plots.faithfulness_curve(curve, circuit["target"], len(circuit["nodes"]))
    return figure_html(fig, "Faithfulness (resample ablation) with the first k heads by |exact patching effect| kept; "
                            "dashed: the target, dotted: the circuit's size.")


def _areas_html(areas: dict[str, Any] | None) -> str:
    """MIB's CPR and CMD of the faithfulness curves over heads and over edges ("" where not recorded)."""
    if areas is None:  # an analysis.json written before they were
        return ""
    nodes = "; ".join(f"{name} ablation: CPR {one['cpr']:.2f}, CMD {one['cmd']:.2f}"
                      for name, one in areas["nodes"].items())
    edges = areas["edges"]
    over_edges = "" if edges is None else (
        f" Over the share of the model's {edges['n_edges']} edges kept, strongest path patching effect first (every "
        f"head kept, {edges['ablation']} ablation): CPR {edges['cpr']:.2f}, CMD {edges['cmd']:.2f}.")
    text = (f"As the MIB benchmark scores circuits, CPR is the area under the faithfulness curve over the share of "
            f"heads kept (higher is better) and CMD the area under |1 - faithfulness| (0 is best). Over heads, "
            f"{nodes}.{over_edges}")
    return f"<p>{html.escape(text)}</p>"


def _edges_sentence(circuit: dict[str, Any]) -> str:
    """How the drawn edges were chosen, and what they keep."""
    if circuit["edge_faithfulness"] is None:  # path patching refused the model, or an older analysis.json
        if circuit["edges"]:
            return ("Edges: path patching between kept heads and to the logits, drawn where |value| >= 0.05, not "
                    "ablated.")
        return ("No edges: no head is kept." if not circuit["nodes"] else
                "No edges: path patching does not apply to this model.")
    return (f"Edges: {len(circuit['edges'])} of the {circuit['candidate_edges']} edges among the kept heads (a head's "
            f"output into a later kept head's query, key or value, or into the logits directly), left after dropping "
            f"edges, weakest path patching effect first, while the faithfulness stays at the target; with only "
            f"these edges the heads keep {effect(circuit['edge_faithfulness'])} "
            f"({effect(circuit['edge_faithfulness_mean'])} under mean ablation), with none of them "
            f"{effect(circuit['no_edge_faithfulness'])}. Paths through MLPs are "
            f"not edges: MLPs read the residual stream as it flows. Each edge is labelled with its path patching "
            f"effect.")


def _estimates_cost(patching: dict[str, Any]) -> str:
    """AtP*'s yardstick for each per-head estimate, and where the rest is measured."""
    judged = {name: one for name, one in patching["heads_estimates_verified"].items() if one}
    if not judged:  # nothing to find, or an analysis written before it
        return ""
    one = next(iter(judged.values()))
    ranked = has_rank_correlation(_n_heads(patching))  # over fewer heads, no Spearman is printed at all
    costs = ", ".join(f"{ESTIMATE_NAMES.get(name, name)} {found['heads']}"
                      + (f" (Spearman {rank_correlation(found['spearman'], _n_heads(patching))})" if ranked else "")
                      for name, found in judged.items())
    return (f" Heads verified in each estimate's order until exact's top {one['k']} are found, of {one['of']}: "
            f"{costs}. For head x position cells and the QK fix on queries and keys, side by side: "
            f"`workbench benchmark --patching RUN`.")


def _agreement_note(patching: dict[str, Any]) -> str:
    agreement, n_heads = patching["heads_attribution_spearman"], _n_heads(patching)
    verified = patching["heads_attribution_verified"]
    cost = ("" if not verified else f" Patching heads exactly in attribution's order finds exact's top {verified['k']} "
            f"after {verified['heads']} of {verified['of']} heads (AtP*'s yardstick).") + _estimates_cost(patching)
    if not has_rank_correlation(n_heads):  # over 2-4 heads Spearman takes a handful of values: +-1 says nothing
        return (f"Rank correlation with exact: {rank_correlation(agreement, n_heads)}; compare the values, "
                f"{_largest_listed(patching)}.{cost}")
    if agreement is None:
        return "Its agreement with exact patching is undefined: one of the two maps is constant."
    gap = abs(patching["heads"]["clean_metric"] - patching["heads"]["corrupted_metric"])
    if gap < MIN_METRIC_GAP:
        return (f"Spearman correlation with exact: {agreement:.2f}, of little meaning here (see the warning "
                f"above).{cost}")
    trust = ("Its ranking broadly agrees with exact patching." if agreement >= GOOD_AGREEMENT
             else "Its ranking differs from exact patching here: read the exact map, and use attribution only "
                  "to screen (README, Known limits).")
    return (f"Spearman correlation with exact: {agreement:.2f}. {trust} Largest effects, "
            f"{_largest_listed(patching)}.{cost}")


def _largest_listed(patching: dict[str, Any]) -> str:
    """"exact: L0H1 -0.70, ...; attribution: ...": the largest |effects| of both per-head maps."""
    exact, estimate = (_largest_heads(patching[key]) for key in ("heads", "heads_attribution"))
    return "; ".join(f"{label}: " + ", ".join(f"{name} {effect(value)}" for name, value in heads)
                     for label, heads in (("exact", exact), ("attribution", estimate)))


def _n_heads(patching: dict[str, Any]) -> int:
    """How many heads the per-head patching map ranks."""
    return sum(len(row) for row in patching["heads"]["values"])


def _largest_heads(sweep: dict[str, Any], k: int = 3) -> list[tuple[str, float]]:
    """The k heads of a per-head sweep with the largest |value|, as ("L1H2", value)."""
    cells = [(f"L{layer}H{head}", value) for layer, row in zip(sweep["layers"], sweep["values"])
             for head, value in enumerate(row)]
    return sorted(cells, key=lambda cell: -abs(cell[1]))[:k]
