"""A run's circuit as MIB files (`interp.mib`), and how much two circuits share.

`measure_run_circuit` finds a run's circuit as `workbench analyze` does (the same pairs, seed and
label slot, `interp.analysis.counterfactual_pairs`, so on the CPU the same heads and edges as
its analysis.json), and keeps every head's and every edge's score. `mib_files` writes it as MIB
circuit files: the circuit, and one file per MIB edge budget.

`compare_circuits` compares two circuits given as MIB files (ours or anyone's), over the parts
our circuits choose: heads, and the edges we score (head -> later head's q/k/v, head -> logits;
edges from the input or MLPs and into MLPs are left out: our circuits never cut them). For the
circuits themselves and, at each of MIB's edge budgets, for the k edges of largest |score|
(k = int(pct * scored edges), the same k in both where the models have one shape) and the heads
those edges touch, it gives the sizes, the number shared, the Jaccard index |A & B| / |A | B|
and the overlap |A & B| / min(|A|, |B|). Heads of one layer have no identity across training
seeds (any permutation of a layer's heads is the same model), so each is given twice: by name,
and by layer (multisets of layers for heads, of (sender layer, receiver layer or logits, q/k/v)
for edges: the best any permutation of heads within layers could reach for heads, an upper bound
of it for edges). Also the Spearman correlation of the two models' edge scores and head scores
(by name). Two circuits of models of different shapes are refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from interp.circuit_spread import MeasuredCircuit, circuit_on_pairs
from interp.mib import MIB_PERCENTAGES, mib_circuit, mib_file, threshold_circuits, top_edges
from interp.patching import logit_diff_metric, spearman
from interp.task_analysis import counterfactual_pairs
from models.runs import LoadedRun


def measure_run_circuit(run: LoadedRun, n_pairs: int = 64, seed: int = 0, edges: bool = True
                        ) -> tuple[MeasuredCircuit, str]:
    """The run's circuit on the task's counterfactual pairs, as `workbench analyze` finds it, and
    what the pairs are; without `edges`, its heads only (no path patching: no edge scores)."""
    clean, corrupted, slot, description = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    metric = logit_diff_metric(clean, corrupted, label_index=slot)
    device = next(run.model.parameters()).device
    return circuit_on_pairs(run.model, clean.tokens.to(device), corrupted.tokens.to(device), metric, edges), description


def pct_name(pct: float) -> str:
    return f"edges-{100 * pct:g}pct.json"


def mib_files(measured: MeasuredCircuit, meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File name -> MIB file: "circuit.json" (the circuit, with every score) and, where path
    patching scored the edges, one per MIB edge budget (`pct_name`)."""
    circuit = measured.circuit
    kept = None if not measured.edge_scores else [(s, r) for s, r, _ in circuit.edges]
    about = {**meta, "target": circuit.target, "ablation": circuit.ablation, "rule": circuit.rule,
             "faithfulness": circuit.faithfulness, "faithfulness_mean": circuit.faithfulness_mean,
             "edge_faithfulness": circuit.edge_faithfulness, "reached": circuit.reached,
             "path_patching_refused": measured.refused}
    files = {"circuit.json": mib_file(measured.cfg, circuit.nodes, kept, measured.edge_scores, measured.head_scores,
                                      about)}
    if measured.edge_scores:
        curve = dict(zip(circuit.edge_sizes, circuit.edge_curve))
        budgets = threshold_circuits(measured.cfg, measured.edge_scores, measured.head_scores,
                                     {**meta, "ablation": circuit.ablation}, curve)
        files |= {pct_name(pct): data for pct, data in budgets.items()}
    return files


def overlap(a: Iterable[Any], b: Iterable[Any]) -> dict[str, Any]:
    """Sizes, shared, Jaccard and overlap coefficient of two multisets (sets: no repeats);
    Jaccard None where both are empty, overlap None where either is."""
    ca, cb = Counter(a), Counter(b)
    shared, union = sum((ca & cb).values()), sum((ca | cb).values())
    size_a, size_b = sum(ca.values()), sum(cb.values())
    return {"a": size_a, "b": size_b, "shared": shared, "jaccard": round(shared / union, 4) if union else None,
            "overlap": round(shared / min(size_a, size_b), 4) if min(size_a, size_b) else None}


def _layer(head: str) -> int:
    return int(head[1:].split("H")[0])


def _edge_layers(edge: tuple[str, str]) -> tuple[int, str, str]:
    sender, receiver = edge
    if receiver == "logits":
        return _layer(sender), "logits", ""
    head, _, port = receiver.partition(".")
    return _layer(sender), str(_layer(head)), port


def _heads_of(edges: Iterable[tuple[str, str]]) -> set[str]:
    return {head for sender, receiver in edges for head in (sender, receiver.split(".")[0]) if head != "logits"}


def _compared(heads_a: Iterable[str], heads_b: Iterable[str], edges_a: list[tuple[str, str]],
              edges_b: list[tuple[str, str]]) -> dict[str, Any]:
    heads_a, heads_b = list(heads_a), list(heads_b)
    return {"heads": overlap(heads_a, heads_b), "heads_by_layer": overlap(map(_layer, heads_a), map(_layer, heads_b)),
            "edges": overlap(edges_a, edges_b),
            "edges_by_layer": overlap(map(_edge_layers, edges_a), map(_edge_layers, edges_b))}


def compare_circuits(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """How much two circuits (MIB files, `interp.mib.check_mib`-valid) share (module doc)."""
    shape = [{key: data["cfg"][key] for key in ("n_layers", "n_heads", "parallel_attn_mlp")} for data in (a, b)]
    if shape[0] != shape[1]:
        raise ValueError(f"the circuits are of models of different shapes ({shape[0]} and {shape[1]}): their heads "
                         f"and edges do not correspond")
    ca, cb = mib_circuit(a), mib_circuit(b)
    result: dict[str, Any] = {"shape": shape[0], "circuit": _compared(
        ca["heads"], cb["heads"], [(s, r) for s, r, _ in ca["edges"]], [(s, r) for s, r, _ in cb["edges"]])}
    scored = any(ca["scores"].values()) and any(cb["scores"].values())  # all 0: no path patching
    result["thresholds"] = [] if not scored else [
        {"percent": round(100 * pct, 1), "k": int(pct * len(ca["scores"])),
         **_compared(_heads_of(top_a), _heads_of(top_b), top_a, top_b)}
        for pct in MIB_PERCENTAGES
        for top_a, top_b in [(top_edges(ca["scores"], int(pct * len(ca["scores"]))),
                              top_edges(cb["scores"], int(pct * len(cb["scores"]))))]]
    edges = sorted(ca["scores"])
    result["edge_score_spearman"] = _spearman([ca["scores"][e] for e in edges], [cb["scores"][e] for e in edges]) \
        if scored else None
    head_scores = [[data["nodes"][name].get("score") for name in sorted(data["nodes"]) if ".h" in name]
                   for data in (a, b)]
    result["head_score_spearman"] = None if None in head_scores[0] + head_scores[1] else \
        _spearman(head_scores[0], head_scores[1])
    return result


def _spearman(a: list[float], b: list[float]) -> float | None:
    value = spearman(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    return round(value, 4) if value == value else None


def comparison_lines(result: dict[str, Any]) -> list[str]:
    """The comparison as lines of text: one per set compared."""

    def line(name: str, part: dict[str, Any]) -> str:
        cells = []
        for key in ("heads", "heads_by_layer", "edges", "edges_by_layer"):
            one = part[key]
            jaccard = "-" if one["jaccard"] is None else f"{one['jaccard']:.2f}"
            cells.append(f"{key} {one['shared']}/{one['a']}+{one['b']} J={jaccard}")
        return f"{name:>14}: " + "; ".join(cells)

    lines = [line("circuit", result["circuit"])]
    lines += [line(f"{t['percent']:g}% (k={t['k']})", t) for t in result["thresholds"] if t["k"]]
    lines.append(f"Spearman of edge scores {result['edge_score_spearman']}, of head scores "
                 f"{result['head_score_spearman']}")
    return lines
