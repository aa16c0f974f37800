"""A circuit graph from patching: the fewest heads that keep a target share of the behaviour,
measured, and the paths between them.

Nodes are attention heads. A set of heads is *kept* by running the clean input with every other
head's output (`attn.hook_z`) ablated. `ablation="resample"` (the default) replaces it by its
value on the paired corrupted input; `ablation="mean"` by its mean over every clean and
corrupted input of the batch, per position (the task's sentences share their layout, so a
position's mean is that slot's typical output). Embeddings and MLPs always run on the clean
input, so the set's faithfulness,

    (m_kept - m_corrupted) / (m_clean - m_corrupted),

is 1 with every head kept, and with none kept it is what the heads do not carry. Both ablations
share that scale (0 = the corrupted run), so they can be read side by side: the circuit is chosen
under resample ablation, and `Circuit.faithfulness_mean` measures the same heads under mean
ablation, a check that the set does not depend on which corrupted value stood in. Heads join in
the order of their exact patching effect (largest |effect| first) until the faithfulness reaches
the target (0.9 by default); the whole curve is returned, so a circuit that never reaches it
says so. Edges are the path patching effects (interp/paths.py) between kept heads and from kept
heads to the logits, with |value| at least `edge_threshold`. They are drawn, not ablated one by
one: the faithfulness is that of the node set.

Shape glossary: batch = counterfactual pairs, pos, head_index, d_head.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching import Metric, _baselines, _mean_metric
from interp.paths import PathPatchResult

TARGET = 0.9
ABLATIONS = ("resample", "mean")


@dataclass
class Circuit:
    nodes: list[str]  # "L1H3", in the order they joined
    edges: list[tuple[str, str, float]]  # (sender, receiver "L2H0.v" or "logits", path effect)
    faithfulness: float  # of `nodes`, normalised (1 = clean behaviour)
    target: float
    curve: list[float] = field(default_factory=list)  # faithfulness with the first k heads, k = 0..n_heads
    order: list[str] = field(default_factory=list)  # every head, by |exact effect|
    ablation: str = "resample"  # how the heads outside a set were ablated to choose it
    faithfulness_mean: float | None = None  # of `nodes`, every other head mean-ablated instead

    @property
    def reached(self) -> bool:
        return self.faithfulness >= self.target

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "edges": [list(e) for e in self.edges], "reached": self.reached}


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


@torch.no_grad()
def kept_faithfulness(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, kept: list[set[tuple[int, int]]], ablation: str = "resample",
) -> list[float]:
    """Faithfulness of each set of kept heads (every other head ablated: see the module's doc)."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation {ablation!r} is unknown; use one of {ABLATIONS}")
    n = clean_tokens.shape[0]
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]),
                                         names_filter=lambda name: name.endswith("attn.hook_z"))
    clean_metric, corrupted_metric = _baselines(metric, logits, n)
    if ablation == "resample":
        stand_in = {name: z[n:] for name, z in cache.items()}
    else:  # one [pos head d_head] mean, broadcast over the batch
        stand_in = {name: z.mean(0, keepdim=True) for name, z in cache.items()}
    out = []
    for heads in kept:
        def ablate(z: Tensor, hook: Any, heads: set[tuple[int, int]] = heads) -> Tensor:
            layer = hook.layer()
            drop = [h for h in range(z.shape[2]) if (layer, h) not in heads]
            z[:, :, drop] = stand_in[hook.name][:, :, drop]
            return z

        with model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), ablate)]):
            value = _mean_metric(metric, model(clean_tokens)).item()
        out.append((value - corrupted_metric) / (clean_metric - corrupted_metric))
    return out


def find_circuit(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    head_effects: Tensor, paths: PathPatchResult | None, target: float = TARGET, edge_threshold: float = 0.05,
    ablation: str = "resample",
) -> Circuit:
    """The smallest prefix of heads, by |exact effect| (`head_effects` [layer head]), whose
    faithfulness under `ablation` reaches `target`; the same heads' faithfulness under the other
    ablation when that is mean (a cross-check); and the path effects among them."""
    n_layers, n_heads = head_effects.shape
    order = sorted(((layer, head) for layer in range(n_layers) for head in range(n_heads)),
                   key=lambda lh: -abs(head_effects[lh].item()))
    prefixes = [set(order[:k]) for k in range(len(order) + 1)]
    curve = kept_faithfulness(model, clean_tokens, corrupted_tokens, metric, prefixes, ablation)
    size = next((k for k, value in enumerate(curve) if value >= target), len(order))
    mean = curve[size] if ablation == "mean" else \
        kept_faithfulness(model, clean_tokens, corrupted_tokens, metric, [prefixes[size]], "mean")[0]
    nodes = [head_name(*lh) for lh in order[:size]]
    edges = []
    if paths is not None:
        kept = set(nodes)
        edges = [(s, r, round(v, 4)) for s, r, v in paths.strongest(k=10_000)
                 if s in kept and (r == "logits" or r.split(".")[0] in kept) and abs(v) >= edge_threshold]
    return Circuit(nodes, edges, round(curve[size], 4), target, [round(c, 4) for c in curve],
                   [head_name(*lh) for lh in order], ablation, round(mean, 4))


def circuit_svg(circuit: dict[str, Any], n_layers: int, n_heads: int, labels: list[list[str]] | None = None) -> str:
    """A layered drawing: heads by layer (layer 0 at the bottom, the logits on top), kept heads
    filled and named with their label, path edges as lines whose width follows |effect|
    (blue positive, red negative)."""
    width, row, left = 140 + 110 * n_heads, 90, 90
    height = row * (n_layers + 1) + 40
    where = {head_name(layer, head): (left + 110 * head, height - 40 - row * layer)
             for layer in range(n_layers) for head in range(n_heads)}
    where["logits"] = (left + 110 * (n_heads - 1) / 2, 30)
    kept = set(circuit["nodes"])
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' class='circuit' "
             "font-family='sans-serif' font-size='11'>"]
    for sender, receiver, value in circuit["edges"]:
        ends = (str(sender), str(receiver).split(".")[0])
        if not all(end in where for end in ends) or not isinstance(value, (int, float)):
            continue  # not a head of this model (a hand-edited analysis.json): drawn nowhere
        (x1, y1), (x2, y2) = where[ends[0]], where[ends[1]]
        colour = "#2166ac" if value > 0 else "#b2182b"
        port = str(receiver).partition(".")[2]
        parts.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{colour}' stroke-opacity='0.7' "
                     f"stroke-width='{1 + 8 * min(1.0, abs(value)):.1f}'><title>{html.escape(f'{sender} -> {receiver}: {value:+.3f}')}"
                     f"</title></line>")
        if port:
            parts.append(f"<text x='{(x1 + x2) / 2 + 4}' y='{(y1 + y2) / 2}' fill='{colour}'>{html.escape(port)}</text>")
    for name, (x, y) in where.items():
        if name == "logits":
            parts.append(f"<rect x='{x - 30}' y='{y - 12}' width='60' height='24' fill='#eee' stroke='#333'/>"
                         f"<text x='{x}' y='{y + 4}' text-anchor='middle'>logits</text>")
            continue
        layer, head = (int(part) for part in name[1:].split("H"))
        kind = str(labels[layer][head]) if labels else ""
        fill = "#fdb863" if name in kept else "#f7f7f7"
        parts.append(f"<circle cx='{x}' cy='{y}' r='22' fill='{fill}' stroke='#333'/>"
                     f"<text x='{x}' y='{y - 2}' text-anchor='middle'>{name}</text>"
                     f"<text x='{x}' y='{y + 11}' text-anchor='middle' font-size='9'>{html.escape(kind[:11])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def chains_to_logits(circuit: dict[str, Any]) -> list[list[str]]:
    """Every path along the circuit's edges that ends at the logits, as head names then
    "logits"; longest first, then by the weakest edge on it (strongest first)."""
    into: dict[str, list[tuple[str, float]]] = {}
    for sender, receiver, value in circuit["edges"]:
        into.setdefault(receiver.split(".")[0], []).append((sender, abs(value)))

    def back(node: str, seen: frozenset[str]) -> list[tuple[list[str], float]]:
        found = [([node], float("inf"))]
        for sender, value in into.get(node, []):
            if sender not in seen:  # edges run from earlier to later layers; guard anyway
                found += [([*path, node], min(weakest, value)) for path, weakest in back(sender, seen | {sender})]
        return found

    paths = [(path, weakest) for path, weakest in back("logits", frozenset()) if len(path) > 1]
    paths.sort(key=lambda item: (-len(item[0]), -item[1]))
    return [path for path, _ in paths]


def layer_of(name: str) -> int:
    return int(name[1:].split("H")[0])


def loop_steps(chain: list[str], kinds: dict[str, str]) -> list[tuple[str, str]]:
    """The edges of a chain from an association head to a manipulation head in the next layer,
    or the other way round: one iteration of the LEGO for-loop each."""
    pairs = zip(chain, chain[1:])
    return [(a, b) for a, b in pairs if b != "logits" and layer_of(b) == layer_of(a) + 1
            and {kinds.get(a), kinds.get(b)} == {"association", "manipulation"}]
