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
share that scale (0 = the corrupted run), so they can be read side by side. Heads join in the
order of their exact patching effect (largest |effect| first); the curve (faithfulness of the
first k heads, k = 0..N) is measured under both ablations (`Circuit.curves`; `curve` is
`ablation`'s), and the circuit is the first k chosen by `rule`:

  "stays" (the default)  the curve under `ablation` reaches the target (0.9 by default) at k and
                         stays there for every larger prefix
  "first"                the curve under `ablation` reaches the target at k
  "both"                 the curves under both ablations reach the target at k

"first" is fooled by cancellation. Two heads whose corrupted outputs both flip a sign that a
later head multiplies (one feeds its query, one its key) cancel when resampled together, so the
prefix holding only the later head already "keeps 100%" and the heads feeding it are left out
(tests/data/circuits/cancellation: "first" keeps 1 of its 4 heads, curve 0, 1.0, 0.5, 0.5, 1.0,
...). Heads join one at a time, so on the way to the whole model a prefix holds one head of the
pair and not the other, and the cancellation breaks: the curve dips, and "stays" does not stop
before the dip (it keeps all 4, and every edge of the chain). "both" catches this case too (mean
ablation sets the sign to 0: faithfulness 0.75), but mean ablation asks another question,
whether a head is needed at all rather than whether it carries the clean/corrupted difference,
and on trained models it answers "every head": on the zoo's lego-three-hops (64 pairs) the mean
curve stays near 0.5 until the last of its 16 heads joins, so "both" keeps 16 heads where
"first" and "stays" keep 3 (lego-association: 13 against 5; lego-planted and
composite-inferential: the same under every rule). "stays" is the rule to use against
cancellation, and the default. Its price: on an untrained model, whose curve swings far above
and below 1, it keeps more heads than "first" (the tiny untrained LEGO run of
tests/integration/test_analyze.py: all 8 heads, its curve back down to 0.38 at 7, where "first"
kept 2 at 2.37). The circuit keeps its curves, so `Circuit.sizes_by_rule()` says what each rule
would have kept (a circuit whose rules disagree is one to read with care). The mean-ablation
faithfulness of the chosen heads is reported beside the curve (`Circuit.faithfulness_mean`). A
circuit that never reaches the target is the whole model, and says so (`reached`).

Faithfulness over circuit size, as MIB (Mueller et al. 2025) scores circuits: with x = k / N
the share of the model's heads kept (the first k of the order), CPR is the area under the
faithfulness curve and CMD the area under |1 - faithfulness|, on [0, 1] (piecewise linear
between measured sizes): CPR 1 and CMD 0 for a model whose smallest circuits are already
faithful. Likewise over edges: every head kept and only the k edges of the whole model with the
largest |path patching effect| (`Circuit.edge_curve`, every k up to DENSE_EDGES edges, a grid of
fractions beyond). `Circuit.cpr`, `.cmd`, `.edge_cpr`, `.edge_cmd`, `.areas()`. `to_dict()`
writes `areas()` to analysis.json (nodes: CPR and CMD under each ablation; edges: CPR, CMD and
the edge curve) and `rule`; the node curves under other ablations than `ablation` stay
attributes.

Edges are then ablated too (`edge_faithfulness`, pre-LN models). An edge is a kept head's output
reaching a later kept head's query, key or value input ("L1H3" -> "L2H0.v"), or reaching the
logits directly ("L1H3" -> "logits"). Ablating an edge gives that one input the sender's
stand-in output instead of its own: the receiver's input is its residual stream minus
(z_sender - z_stand_in) W_O of the sender, everything else unchanged (TransformerLens's split
q/k/v inputs, `use_split_qkv_input`; with grouped key/value heads, each query head's own copy,
`ungroup_grouped_query_attention`: both switched on for the call). Paths through MLPs are not
edges: MLPs read the stream as it flows, like the embeddings. Starting from every edge among the
kept heads, edges are dropped greedily, weakest path-patching effect first, while the faithfulness
stays at the target; the edges left, their faithfulness under resample and under mean ablation, and
the faithfulness with every edge ablated are the circuit's; under `rule="both"` an edge is dropped
only while the mean ablation's faithfulness stays at its target too. One edge is dropped at a time,
each tried with every other edge left kept, so two edges that cancel cannot be dropped together:
dropping either alone breaks the cancellation. Greedy, so the edge set is small, not proven minimal.
Edge ablation refuses the models path patching refuses (`interp.paths.check_path_patchable`:
post-LN, identity-augmented attention, a norm after attention ...; the table is in docs/limits.md),
and there the circuit has no edges.

Shape glossary: batch = counterfactual pairs, pos, head_index, d_head.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching import Metric, baseline_metrics, mean_metric
from interp.paths import INPUTS, PathPatchResult, check_path_patchable, per_head_inputs

TARGET = 0.9
ABLATIONS = ("resample", "mean")
RULES = ("first", "stays", "both")  # how the circuit's size is chosen from the curves (module doc)
DENSE_EDGES = 128  # the edge curve measures every size up to this many edges in the model, a grid beyond
EDGE_FRACTIONS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_NOT_WRITTEN = ("curves", "edge_sizes", "edge_curve", "n_edges")  # attributes (`areas` writes what they give)


@dataclass
class Circuit:
    nodes: list[str]  # "L1H3", in the order they joined
    # the kept edges (sender, receiver "L2H0.v" or "logits", path patching effect), strongest first
    edges: list[tuple[str, str, float]]
    faithfulness: float  # of `nodes`, normalised (1 = clean behaviour)
    target: float
    curve: list[float] = field(default_factory=list)  # faithfulness with the first k heads, k = 0..n_heads
    order: list[str] = field(default_factory=list)  # every head, by |exact effect|
    ablation: str = "resample"  # how the heads outside a set were ablated to choose it
    faithfulness_mean: float | None = None  # of `nodes`, every other head mean-ablated instead
    # of `nodes` with only `edges` kept (None: no edges, path patching refused the model)
    edge_faithfulness: float | None = None
    edge_faithfulness_mean: float | None = None  # the same, mean ablation
    no_edge_faithfulness: float | None = None  # of `nodes` with every edge among them ablated
    candidate_edges: int = 0  # edges among the kept heads before pruning
    rule: str = "stays"  # how the size was chosen (RULES, module doc)
    # not in to_dict as such (_NOT_WRITTEN); their CPR and CMD are, as "areas"
    curves: dict[str, list[float]] = field(default_factory=dict)  # ablation -> faithfulness of the first k heads
    edge_sizes: list[int] = field(default_factory=list)  # k: every head kept, only the k strongest edges
    edge_curve: list[float] = field(default_factory=list)  # faithfulness at each of edge_sizes, under `ablation`
    n_edges: int = 0  # edges in the whole model (the edge curve's x axis is k / n_edges); 0: no edge curve

    @property
    def reached(self) -> bool:
        """Whether `nodes` reach the target: under every ablation measured (rule "both"), or
        under `ablation` (the other rules)."""
        if self.rule == "both" and self.curves:
            return all(curve[len(self.nodes)] >= self.target for curve in self.curves.values())
        return self.faithfulness >= self.target

    @property
    def cpr(self) -> float:
        """Area under the faithfulness curve over the share of heads kept (`ablation`'s; 1 is best)."""
        return faithfulness_areas(self.curve)[0]

    @property
    def cmd(self) -> float:
        """Area under |1 - faithfulness| over the share of heads kept (`ablation`'s; 0 is best)."""
        return faithfulness_areas(self.curve)[1]

    @property
    def edge_cpr(self) -> float | None:
        """CPR over the share of the model's edges kept, strongest path effect first (None: no edges)."""
        return faithfulness_areas(self.edge_curve, self.edge_sizes, self.n_edges)[0] if self.n_edges else None

    @property
    def edge_cmd(self) -> float | None:
        return faithfulness_areas(self.edge_curve, self.edge_sizes, self.n_edges)[1] if self.n_edges else None

    def areas(self) -> dict[str, Any]:
        """CPR and CMD of every curve: nodes per ablation, edges under `ablation` (None where path
        patching gave no edges), rounded to 4 places."""
        nodes = {name: dict(zip(("cpr", "cmd"), (round(v, 4) for v in faithfulness_areas(curve))))
                 for name, curve in (self.curves or {self.ablation: self.curve}).items()}
        edges = None if not self.n_edges else {
            "ablation": self.ablation, "cpr": round(self.edge_cpr, 4), "cmd": round(self.edge_cmd, 4),
            "n_edges": self.n_edges, "sizes": list(self.edge_sizes), "curve": list(self.edge_curve)}
        return {"nodes": nodes, "edges": edges}

    def sizes_by_rule(self) -> dict[str, int]:
        """How many heads each rule of RULES keeps, from this circuit's curves (empty where the
        circuit has none)."""
        if not self.curves:
            return {}
        return {rule: circuit_size(self.curves, self.ablation, self.target, rule) for rule in RULES}

    def to_dict(self) -> dict[str, Any]:
        written = {key: value for key, value in asdict(self).items() if key not in _NOT_WRITTEN}
        return {**written, "edges": [list(e) for e in self.edges], "reached": self.reached, "areas": self.areas()}


def faithfulness_areas(values: Sequence[float], sizes: Sequence[int] | None = None,
                       total: int | None = None) -> tuple[float, float]:
    """(CPR, CMD) of a faithfulness curve measured at circuit sizes `sizes` (default 0, 1, ...,
    len - 1) out of `total` (default the last size): the areas under f and under |1 - f| over
    x = size / total in [0, 1], f linear between measured sizes (|1 - f| integrated exactly where
    f crosses 1 between two sizes)."""
    sizes = list(range(len(values))) if sizes is None else list(sizes)
    total = sizes[-1] if total is None else total
    if len(sizes) != len(values) or len(values) < 2 or total <= 0:
        raise ValueError(f"a faithfulness curve needs two or more sizes, one value each, and a total > 0 "
                         f"(got {len(sizes)} sizes, {len(values)} values, total {total})")
    cpr = cmd = 0.0
    for (k0, f0), (k1, f1) in zip(zip(sizes, values), zip(sizes[1:], values[1:])):
        width = (k1 - k0) / total
        cpr += width * (f0 + f1) / 2
        d0, d1 = 1 - f0, 1 - f1
        if d0 * d1 >= 0:
            cmd += width * (abs(d0) + abs(d1)) / 2
        else:  # f crosses 1 inside the segment: two triangles
            cmd += width * (d0 * d0 + d1 * d1) / (2 * (abs(d0) + abs(d1)))
    return cpr, cmd


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def _stand_ins(model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
               ablation: str) -> tuple[float, float, dict[str, Tensor]]:
    """Both baselines, and what stands in for an ablated head's z at each layer: its output on the
    paired corrupted input (resample), or one [pos head d_head] mean broadcast over the batch."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation {ablation!r} is unknown; use one of {ABLATIONS}")
    n = clean_tokens.shape[0]
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]),
                                         names_filter=lambda name: name.endswith("attn.hook_z"))
    clean_metric, corrupted_metric = baseline_metrics(metric, logits, n)
    stand_in = {name: z[n:] if ablation == "resample" else z.mean(0, keepdim=True) for name, z in cache.items()}
    return clean_metric, corrupted_metric, stand_in


@torch.no_grad()
def kept_faithfulness(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, kept: list[set[tuple[int, int]]], ablation: str = "resample",
) -> list[float]:
    """Faithfulness of each set of kept heads (every other head ablated: see the module's doc)."""
    clean_metric, corrupted_metric, stand_in = _stand_ins(model, clean_tokens, corrupted_tokens, metric, ablation)
    out = []
    for heads in kept:
        def ablate(z: Tensor, hook: Any, heads: set[tuple[int, int]] = heads) -> Tensor:
            layer = hook.layer()
            drop = [h for h in range(z.shape[2]) if (layer, h) not in heads]
            z[:, :, drop] = stand_in[hook.name][:, :, drop]
            return z

        with model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), ablate)]):
            value = mean_metric(metric, model(clean_tokens)).item()
        out.append((value - corrupted_metric) / (clean_metric - corrupted_metric))
    return out


Edge = tuple[tuple[int, int], tuple[int, int, str] | str]  # (sender, (layer, head, input) or "logits")
LOGITS = "logits"


def edge_name(edge: Edge) -> tuple[str, str]:
    (sender, receiver) = edge
    return head_name(*sender), receiver if receiver == LOGITS else f"{head_name(*receiver[:2])}.{receiver[2]}"


def candidate_edges(nodes: set[tuple[int, int]]) -> list[Edge]:
    """Every edge among kept heads: sender -> each input of a kept head of a later layer, and
    sender -> logits."""
    edges: list[Edge] = []
    for sender in sorted(nodes):
        edges += [(sender, (*receiver, i)) for receiver in sorted(nodes) if receiver[0] > sender[0] for i in INPUTS]
        edges.append((sender, LOGITS))
    return edges


@torch.no_grad()
def edge_faithfulness(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, nodes: set[tuple[int, int]], kept: list[set[Edge]], ablation: str = "resample",
) -> list[float]:
    """Faithfulness of `nodes` with only each set of edges kept among them (module doc): every
    other head ablated, and every edge between kept heads that is not in the set ablated."""
    check_path_patchable(model)
    return _edge_values(model, clean_tokens, metric, nodes, kept,
                        _stand_ins(model, clean_tokens, corrupted_tokens, metric, ablation))


def _edge_values(model: HookedTransformer, clean_tokens: Tensor, metric: Metric, nodes: set[tuple[int, int]],
                 kept: list[set[Edge]], stand_ins: tuple[float, float, dict[str, Tensor]]) -> list[float]:
    """`edge_faithfulness` against given baselines and stand-ins (`_stand_ins`: one forward of
    the clean and corrupted batch, which a caller measuring many edge sets in turn makes once)."""
    n_heads = model.cfg.n_heads
    clean_metric, corrupted_metric, stand_in = stand_ins
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    out = []
    with per_head_inputs(model, split_qkv=True):
        for edges in kept:
            deltas: dict[tuple[int, int], Tensor] = {}  # a kept head's output minus its stand-in's, in d_model

            def heads(z: Tensor, hook: Any, deltas: dict = deltas) -> Tensor:
                layer, standing = hook.layer(), stand_in[hook.name]
                for head in range(n_heads):
                    if (layer, head) in nodes:
                        w_o = model.blocks[layer].attn.W_O[head]
                        deltas[layer, head] = (z[:, :, head] - standing[:, :, head]) @ w_o
                    else:
                        z[:, :, head] = standing[:, :, head]
                return z

            def inputs(x: Tensor, hook: Any, edges: set[Edge] = edges, deltas: dict = deltas) -> Tensor:
                layer, name = hook.layer(), hook.name.split(".")[-1][len("hook_")]  # x: [batch pos head d_model]
                for head in range(n_heads):
                    if (layer, head) in nodes:
                        cut = [d for sender, d in deltas.items() if ((sender, (layer, head, name)) not in edges)]
                        if cut:
                            x[:, :, head] = x[:, :, head] - torch.stack(cut).sum(0)
                return x

            def direct(resid: Tensor, hook: Any, edges: set[Edge] = edges, deltas: dict = deltas) -> Tensor:
                cut = [d for sender, d in deltas.items() if (sender, LOGITS) not in edges]
                return resid - torch.stack(cut).sum(0) if cut else resid

            hooks = [(lambda name: name.endswith("attn.hook_z"), heads),
                     (lambda name: name.endswith(("hook_q_input", "hook_k_input", "hook_v_input")), inputs),
                     (last, direct)]
            with model.hooks(fwd_hooks=hooks):
                value = mean_metric(metric, model(clean_tokens)).item()
            out.append((value - corrupted_metric) / (clean_metric - corrupted_metric))
    return out


def prune_edges(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    nodes: set[tuple[int, int]], strength: dict[tuple[str, str], float], target: float, ablation: str = "resample",
    also: dict[str, float] | None = None,
) -> tuple[set[Edge], float]:
    """Drop edges among `nodes`, weakest |path effect| (`strength`, by edge name) first, while the
    faithfulness stays >= `target`, and under each other ablation of `also` (ablation -> its
    target) >= that target too; return the edges left and their faithfulness under `ablation`."""
    check_path_patchable(model)
    stand_ins = {name: _stand_ins(model, clean_tokens, corrupted_tokens, metric, name)
                 for name in {ablation, *(also or {})}}

    def faithfulness(edges: set[Edge], name: str = ablation) -> float:
        return _edge_values(model, clean_tokens, metric, nodes, [edges], stand_ins[name])[0]

    edges = set(candidate_edges(nodes))
    current = faithfulness(edges)
    for edge in sorted(edges, key=lambda e: (abs(strength.get(edge_name(e), 0.0)), edge_name(e))):
        without = faithfulness(edges - {edge})
        if without >= target and all(faithfulness(edges - {edge}, other) >= goal
                                     for other, goal in (also or {}).items()):
            edges, current = edges - {edge}, without
    return edges, current


def edge_curve_sizes(total: int) -> list[int]:
    """The sizes the edge curve measures: every one up to DENSE_EDGES edges; beyond, 0..8 and a
    grid of fractions (EDGE_FRACTIONS) of `total`, and `total`."""
    if total <= DENSE_EDGES:
        return list(range(total + 1))
    return sorted({*range(9), *(round(total * f) for f in EDGE_FRACTIONS), total})


@torch.no_grad()
def edge_curve(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    strength: dict[tuple[str, str], float], ablation: str = "resample",
) -> tuple[list[int], list[float], int]:
    """Faithfulness with every head kept and only the k edges of the whole model (every head's
    q/k/v inputs from earlier heads, every head's direct path to the logits) with the largest
    |path effect| (`strength`), at each k of `edge_curve_sizes`: (sizes, values, number of edges)."""
    heads = {(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)}
    ranked = sorted(candidate_edges(heads), key=lambda e: (-abs(strength.get(edge_name(e), 0.0)), edge_name(e)))
    sizes = edge_curve_sizes(len(ranked))
    values = edge_faithfulness(model, clean_tokens, corrupted_tokens, metric, heads, [set(ranked[:k]) for k in sizes],
                               ablation)
    return sizes, values, len(ranked)


def circuit_size(curves: dict[str, Sequence[float]], ablation: str, target: float, rule: str) -> int:
    """The number of heads `rule` keeps, from the faithfulness of every prefix (k = 0..N) under
    each ablation (`curves`); N where no prefix qualifies."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r} is unknown; use one of {RULES}")
    curve = list(curves[ablation])
    if rule == "stays":
        size = len(curve)
        while size > 0 and curve[size - 1] >= target:
            size -= 1
        return min(size, len(curve) - 1)
    judged = [min(values) for values in zip(*curves.values())] if rule == "both" else curve
    return next((k for k, value in enumerate(judged) if value >= target), len(curve) - 1)


def find_circuit(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    head_effects: Tensor, paths: PathPatchResult | None, target: float = TARGET, ablation: str = "resample",
    rule: str = "stays",
) -> Circuit:
    """The smallest prefix of heads, by |exact effect| (`head_effects` [layer head]), that `rule`
    accepts (module doc: "stays", the default, the first prefix from which the faithfulness under
    `ablation` stays at `target` or above, which a cancelling pair does not fool; "first", the
    first that reaches it; "both", under both ablations); the curve of every prefix under each
    ablation; and, given path patching's `paths`, the edges among the kept heads that keep the
    target (`prune_edges`, under both ablations with rule "both"; when the heads fall short of
    it, the edges that keep what the heads keep), measured under both ablations, and the
    faithfulness curve over the whole model's edges (`edge_curve`)."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r} is unknown; use one of {RULES}")
    n_layers, n_heads = head_effects.shape
    order = sorted(((layer, head) for layer in range(n_layers) for head in range(n_heads)),
                   key=lambda lh: -abs(head_effects[lh].item()))
    prefixes = [set(order[:k]) for k in range(len(order) + 1)]
    measured = (ablation, *(other for other in ABLATIONS if other != ablation))  # `ablation` first: checked first
    curves = {name: kept_faithfulness(model, clean_tokens, corrupted_tokens, metric, prefixes, name)
              for name in measured}
    curve = curves[ablation]
    size = circuit_size(curves, ablation, target, rule)
    nodes = [head_name(*lh) for lh in order[:size]]
    circuit = Circuit(nodes, [], round(curve[size], 4), target, [round(c, 4) for c in curve],
                      [head_name(*lh) for lh in order], ablation, round(curves["mean"][size], 4),
                      curves={name: [round(c, 4) for c in values] for name, values in curves.items()}, rule=rule)
    if paths is None:
        return circuit
    strength = {(s, r): v for s, r, v in paths.strongest(k=None)}
    sizes, values, total = edge_curve(model, clean_tokens, corrupted_tokens, metric, strength, ablation)
    circuit.edge_sizes, circuit.edge_curve, circuit.n_edges = sizes, [round(v, 4) for v in values], total
    if not nodes:
        return circuit
    kept = set(order[:size])
    goal = min(target, curve[size])  # heads that fall short of the target keep every edge
    also = {other: min(target, curves[other][size]) for other in measured[1:]} if rule == "both" else None
    edges, value = prune_edges(model, clean_tokens, corrupted_tokens, metric, kept, strength, goal, ablation, also)
    by_mean = value if ablation == "mean" else \
        edge_faithfulness(model, clean_tokens, corrupted_tokens, metric, kept, [edges], "mean")[0]
    [none] = edge_faithfulness(model, clean_tokens, corrupted_tokens, metric, kept, [set()], ablation)
    named = [(*edge_name(e), round(strength.get(edge_name(e), 0.0), 4)) for e in edges]
    circuit.edges = sorted(named, key=lambda e: (-abs(e[2]), e[0], e[1]))
    circuit.edge_faithfulness, circuit.edge_faithfulness_mean = round(value, 4), round(by_mean, 4)
    circuit.no_edge_faithfulness, circuit.candidate_edges = round(none, 4), len(candidate_edges(kept))
    return circuit


CIRCUIT_LEGEND = ("Orange: the heads kept in the circuit; grey: the others (each named with its label). A line is a "
                  "path-patching edge, labelled with its effect, normalised (1 = the whole clean-corrupted "
                  "difference) and, into a head, the input it reaches (q, k or v): blue raises the metric, red "
                  "lowers it, and its width grows with the size of the effect (1 px, up to 9 px at 1).")
PORT_AT = {"q": 0.35, "k": 0.5, "v": 0.65}  # where along an edge (sender 0, receiver 1) its port's label sits


def circuit_svg(circuit: dict[str, Any], n_layers: int, n_heads: int, labels: list[list[str]] | None = None) -> str:
    """A layered drawing: heads by layer (layer 0 at the bottom, the logits on top), kept heads
    filled and named with their label, path edges as lines whose width follows |effect| (blue
    positive, red negative), each labelled with its effect (and the receiver's q, k or v);
    CIRCUIT_LEGEND says so on the page."""
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
                     f"stroke-width='{1 + 8 * min(1.0, abs(value)):.1f}'>"
                     f"<title>{html.escape(f'{sender} -> {receiver}: {value:+.3f}')}</title></line>")
        # each edge labelled with its effect; q, k and v of one pair of heads share a line, so their labels
        # sit at different heights along it
        t = PORT_AT.get(port, 0.5)
        parts.append(f"<text x='{x1 + t * (x2 - x1) + 4:.1f}' y='{y1 + t * (y2 - y1):.1f}' fill='{colour}'>"
                     f"{html.escape(f'{port} ' if port else '')}{value:+.2f}</text>")
    for name, (x, y) in where.items():
        if name == "logits":
            parts.append(f"<rect x='{x - 30}' y='{y - 12}' width='60' height='24' fill='#eee' stroke='#333'/>"
                         f"<text x='{x}' y='{y + 4}' text-anchor='middle'>logits</text>")
            continue
        layer, head = (int(part) for part in name[1:].split("H"))
        kind = str(labels[layer][head]) if labels else ""
        fill = "#fdb863" if name in kept else "#f7f7f7"
        parts.append(f"<g><title>{html.escape(f'{name} {kind}'.strip())}</title>"
                     f"<circle cx='{x}' cy='{y}' r='22' fill='{fill}' stroke='#333'/>"
                     f"<text x='{x}' y='{y - 2}' text-anchor='middle'>{name}</text>"
                     f"<text x='{x}' y='{y + 11}' text-anchor='middle' "
                     f"font-size='9'>{html.escape(node_label(kind))}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def node_label(kind: str, most: int = 9) -> str:
    """A head's label as it fits inside its node (about 9 characters at 9 px): longer ones cut to
    their first 5 letters and a dot ("manipulation" -> "manip."), never mid-way without a mark."""
    return kind if len(kind) <= most else kind[:5] + "."


def chains_to_logits(edges: Sequence[Sequence[Any]]) -> list[list[str]]:
    """Every path along a circuit's edges (sender, receiver, value) that ends at the logits, as
    head names then "logits"; longest first, then by the weakest edge on it (strongest first)."""
    into: dict[str, list[tuple[str, float]]] = {}
    for sender, receiver, value in edges:
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
