"""How much a circuit depends on the prompt pairs it was found on: the bootstrap.

`circuit_on_pairs` is the circuit pipeline of `workbench analyze` on given pairs: exact head
patching (which orders the heads), path patching (which scores the edges; skipped where the
model is refused, `interp.paths.check_path_patchable`) and `find_circuit`. `bootstrap_circuit`
runs it again on resamples of the pairs, drawn with replacement (as many as there are pairs,
from a seeded local generator), and reports per quantity the 2.5 and 97.5 percentiles over the
resamples (the percentile bootstrap): the faithfulness of the chosen heads, the node CPR and CMD
(`interp.circuit`), the number of heads and, with edges, the faithfulness of the pruned edges
and the edge CPR and CMD. And per head and per edge, the share of resamples whose circuit kept
it; the *stable core* is what at least STABLE of them kept. The heads' order, the edges' scores,
the circuit's size and its pruned edges are all measured again on each resample, so the
intervals cover every step that depends on the pairs; they do not cover the choice of the pairs'
generator, the label slot or the model's training seed (interp.circuit_compare for that).

Cost: one resample costs what the circuit of `workbench analyze` costs (measured on one
thread: docs/analysis.md). `workbench analyze RUN --bootstrap N` stores the result in
analysis.json as the circuit's "bootstrap" entry (`to_dict`), and the report shows it
(`bootstrap_html`).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.circuit import Circuit, find_circuit
from interp.patching import LogitDiff, Metric, patch_head_out
from interp.paths import check_path_patchable, path_patch

STABLE = 0.9  # a head or edge kept in at least this share of the resamples is in the stable core
PERCENTILES = (2.5, 97.5)
_NODE_VALUES = ("faithfulness", "cpr", "cmd", "size")
_EDGE_VALUES = ("edge_faithfulness", "edge_cpr", "edge_cmd")


@dataclass
class MeasuredCircuit:
    """A circuit with what it was chosen from."""

    circuit: Circuit
    head_scores: dict[str, float]  # every head's exact patching effect (normalised), "L1H3" -> value
    # every head -> later head q/k/v and head -> logits edge's path patching effect (normalised), by
    # (sender, receiver) in interp.circuit's names; empty where path patching refused the model
    edge_scores: dict[tuple[str, str], float]
    refused: str | None  # why path patching refused the model, or None
    cfg: dict[str, Any]  # n_layers, n_heads, d_model, parallel_attn_mlp (what interp.mib's files need)


def circuit_on_pairs(model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: LogitDiff,
                     edges: bool = True, **circuit_options: Any) -> MeasuredCircuit:
    """Head patching, path patching (with `edges`, where the model allows it) and `find_circuit`
    (`circuit_options`: target, ablation, rule) on these pairs."""
    args = (model, clean_tokens, corrupted_tokens, metric)
    heads = patch_head_out(*args)
    refused = None
    try:
        check_path_patchable(model)
    except ValueError as err:
        refused = str(err)
    paths = path_patch(*args) if edges and refused is None else None
    circuit = find_circuit(*args, heads.values, paths, **circuit_options)
    cfg = model.cfg
    head_scores = {f"L{layer}H{head}": heads.values[layer, head].item()
                   for layer in range(cfg.n_layers) for head in range(cfg.n_heads)}
    edge_scores = {} if paths is None else {(s, r): v for s, r, v in paths.strongest(k=None)}
    shape = {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model,
             "parallel_attn_mlp": bool(getattr(cfg, "parallel_attn_mlp", False))}
    return MeasuredCircuit(circuit, head_scores, edge_scores, refused, shape)


def resample(metric: LogitDiff, index: Tensor) -> LogitDiff:
    """The metric of the pairs at `index` (repeats allowed)."""
    return LogitDiff(metric.pos[index], metric.clean_label[index], metric.corrupted_label[index])


def bootstrap_circuit(model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
                      n_resamples: int = 20, seed: int = 0, edges: bool = True, stable: float = STABLE,
                      **circuit_options: Any) -> dict[str, Any]:
    """The circuit found again on `n_resamples` resamples of the pairs (module doc), as plain
    values: "intervals" (name -> [low, high] at PERCENTILES, None where not measured), "samples"
    (name -> value per resample), "node_share" / "edge_share" (name -> share of resamples that
    kept it; edges as "L1H3->L2H0.v", only those kept at least once), "stable" (the heads and
    edges kept in >= `stable` of them)."""
    if not isinstance(metric, LogitDiff):
        raise ValueError("the bootstrap resamples the pairs, so it needs the metric as a LogitDiff "
                         "(interp.patching.logit_diff_metric), whose pairs it can index")
    if n_resamples < 2:
        raise ValueError(f"n_resamples={n_resamples}: a bootstrap needs 2 or more resamples")
    started = time.perf_counter()
    n = clean_tokens.shape[0]
    gen = torch.Generator().manual_seed(seed)
    samples: dict[str, list[float | None]] = {name: [] for name in (*_NODE_VALUES, *_EDGE_VALUES)}
    node_counts: dict[str, int] = {}
    edge_counts: dict[str, int] = {}
    heads = [f"L{layer}H{head}" for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    with_edges = False
    for _ in range(n_resamples):
        index = torch.randint(n, (n,), generator=gen).to(clean_tokens.device)
        found = circuit_on_pairs(model, clean_tokens[index], corrupted_tokens[index], resample(metric, index), edges,
                                 **circuit_options)
        circuit = found.circuit
        with_edges = with_edges or bool(found.edge_scores)
        for name, value in (("faithfulness", circuit.faithfulness), ("cpr", circuit.cpr), ("cmd", circuit.cmd),
                            ("size", len(circuit.nodes)), ("edge_faithfulness", circuit.edge_faithfulness),
                            ("edge_cpr", circuit.edge_cpr), ("edge_cmd", circuit.edge_cmd)):
            samples[name].append(None if value is None else round(float(value), 4))
        for head in circuit.nodes:
            node_counts[head] = node_counts.get(head, 0) + 1
        for sender, receiver, _ in circuit.edges:
            key = f"{sender}->{receiver}"
            edge_counts[key] = edge_counts.get(key, 0) + 1
    node_share = {head: round(node_counts.get(head, 0) / n_resamples, 4) for head in heads}
    edge_share = {edge: round(count / n_resamples, 4) for edge, count in
                  sorted(edge_counts.items(), key=lambda item: (-item[1], item[0]))}
    return {"resamples": n_resamples, "seed": seed, "pairs": n, "edges": with_edges, "percentiles": list(PERCENTILES),
            "intervals": {name: _interval(values) for name, values in samples.items()},
            "samples": samples, "node_share": node_share, "edge_share": edge_share,
            "stable": {"share": stable, "nodes": [h for h in heads if node_share[h] >= stable],
                       "edges": [e for e, share in edge_share.items() if share >= stable]},
            "seconds": round(time.perf_counter() - started, 2)}


def _interval(values: list[float | None]) -> list[float] | None:
    """[low, high] percentiles of the measured values; None where some resample did not measure it."""
    if not values or any(v is None for v in values):
        return None
    return [round(float(p), 4) for p in np.percentile(np.array(values, dtype=float), PERCENTILES)]


def bootstrap_html(circuit: dict[str, Any]) -> str:
    """The report's paragraph on a circuit's "bootstrap" entry: the intervals beside the values
    found on every pair, and the stable core ("" where the circuit has no bootstrap)."""
    spread = circuit.get("bootstrap")
    if not spread:
        return ""
    low, high = spread["percentiles"]
    areas = circuit.get("areas") or {}
    found = {"faithfulness": circuit["faithfulness"], "size": len(circuit["nodes"]),
             "cpr": ((areas.get("nodes") or {}).get(circuit.get("ablation"), {})).get("cpr"),
             "cmd": ((areas.get("nodes") or {}).get(circuit.get("ablation"), {})).get("cmd"),
             "edge_faithfulness": circuit.get("edge_faithfulness"),
             "edge_cpr": (areas.get("edges") or {}).get("cpr"), "edge_cmd": (areas.get("edges") or {}).get("cmd")}
    names = {"faithfulness": "faithfulness of the heads", "size": "heads kept", "cpr": "CPR over heads",
             "cmd": "CMD over heads", "edge_faithfulness": "faithfulness of the kept edges",
             "edge_cpr": "CPR over edges", "edge_cmd": "CMD over edges"}
    parts = [f"{label} {_number(found[name])} [{_number(spread['intervals'][name][0], name == 'size')}, "
             f"{_number(spread['intervals'][name][1], name == 'size')}]" for name, label in names.items()
             if spread["intervals"].get(name) is not None]
    stable = spread["stable"]
    share = spread["node_share"]
    unstable = [f"{head} {value:.2f}" for head, value in share.items() if 0 < value < stable["share"]]
    edge_unstable = [f"{edge} {value:.2f}" for edge, value in spread["edge_share"].items() if value < stable["share"]]
    text = (f"Bootstrap: the circuit found again on {spread['resamples']} resamples of the {spread['pairs']} pairs "
            f"(drawn with replacement, seed {spread['seed']}); the values on every pair, with the {low:g}-{high:g} "
            f"percentiles over the resamples: {'; '.join(parts)}. Stable core (kept in at least "
            f"{stable['share']:.0%} of the resamples): heads {', '.join(stable['nodes']) or 'none'}"
            + (f"; edges {', '.join(stable['edges']) or 'none'}" if spread["edges"] else "")
            + f". Kept less often: {', '.join(unstable + edge_unstable) or 'nothing'}.")
    return f"<p class='bootstrap'>{html.escape(text)}</p>"


def _number(value: Any, count: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if count else f"{value:.2f}" if isinstance(value, float) else str(value)
