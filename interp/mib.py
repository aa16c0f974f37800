"""Circuits in the file format of MIB's circuit track (the Mechanistic Interpretability Benchmark,
Mueller et al. 2025, arXiv:2504.13151), so that other tools can read ours and we can read theirs.

What was checked, and where (the published code, not a copy of it):

- github.com/hannamw/EAP-IG, src/eap/graph.py (the `eap` package MIB's repository pins as its
  submodule): `Graph.from_model` builds the graph, `Graph.to_json` writes it, `Graph.from_json`
  reads it. A file is one JSON object with "cfg" (n_layers, n_heads, parallel_attn_mlp,
  d_model), "nodes" ({name: {"in_graph": bool}}, an optional "score") and "edges" ({name:
  {"score": float, "in_graph": bool}}; `from_json` reads "score" for every edge). Nodes are
  "input", "a{layer}.h{head}", "m{layer}" and "logits". Every node before a component in the
  residual stream sends it an edge: a head receives three, named "src->a{l}.h{h}<q>", "<k>" and
  "<v>"; an MLP and the logits one, "src->m{l}", "src->logits". A GPT-2 small graph has 158
  nodes and 32,491 edges (MIB's own example, github.com/hannamw/MIB-circuit-track,
  circuits/ioi-eap-ig.json; `mib_graph(12, 12)` gives the same, and a test checks it).
- github.com/hannamw/MIB-circuit-track, MIB_circuit_track/evaluation.py,
  `evaluate_area_under_curve`: a circuit is scored at fixed edge budgets, `percentages = (.001,
  .002, .005, .01, .02, .05, .1, .2, .5, 1)` of the graph's edges (k = int(pct * edges), the k
  edges of largest |score|), and CPR / CMD are the areas under faithfulness and |1 -
  faithfulness| over those fractions (interp.circuit computes ours the same way). The README's
  submission section asks instead for circuits of at most {0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20,
  50}% of the edges; we write evaluation.py's ten (`MIB_PERCENTAGES`).

How our circuits map onto that graph, and where they differ from MIB's:

- Our nodes are attention heads ("L1H3" is MIB's "a1.h3"); we split each head's input into q, k
  and v as MIB does ("L1H3" -> "L2H0.v" is "a1.h3->a2.h0<v>"; path patching and edge ablation use
  TransformerLens's split q/k/v inputs, `interp.paths.per_head_inputs(split_qkv=True)`), and a
  head's direct path to the logits is "a1.h3->logits".
- We score only those edges: head -> later head's q/k/v and head -> logits, by path patching
  (`interp.paths`: the share of the clean - corrupted metric difference that one path alone
  restores, so it is normalised and signed, where MIB's EAP scores are raw attributions).
  Embeddings and MLPs are never ablated in our circuits: MLPs read the stream as it flows.
  So every MIB edge from "input", from an MLP or into an MLP is unscored here: it is written with
  score 0.0 (MIB's reader needs a number) and in_graph true wherever both its ends are in the
  circuit, which says exactly what our circuit keeps; `meta["unscored_edges"]` counts them. A
  reader that re-ranks the edges by |score| (MIB's `apply_topn`) ranks them last, so CPR/CMD
  computed by MIB's code from our files is not ours.
- Node scores: a head's exact activation patching effect (normalised); "input", MLPs and the
  logits have none. MLP nodes and the input are always in the graph (in_graph true), also for
  attention-only models, which MIB's graph gives MLP nodes all the same.
- The circuit file (`circuit_to_mib`) is the circuit `find_circuit` chose: heads outside it are
  ablated whole (so are all their edges), kept heads keep the pruned edge set among them. The
  threshold files (`threshold_circuits`) follow our edge curve instead: every head kept, only the
  k edges of largest |path effect| kept among the scored ones, with k = int(pct * n_scored),
  MIB's rule applied to the edges we score (MIB's total also counts the unscored edges; both are
  in each file's meta). A file holds a "meta" object MIB's reader ignores: the run, the pairs,
  the counts and the faithfulness we measured for that set.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MIB_PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # evaluation.py's edge budgets
CFG_KEYS = ("n_layers", "n_heads", "parallel_attn_mlp", "d_model")  # what Graph.from_model reads from "cfg"
FILE_KEYS = ("cfg", "nodes", "edges")  # what Graph.from_json requires
# a cfg's sizes, bounded before its graph is built: MIB's largest model (Llama-3.1 8B, 32 layers x 32
# heads) has 1.6 million edges, and a file of the 64 MiB any JSON input may hold lists fewer
MAX_LAYERS, MAX_HEADS, MAX_EDGES = 1024, 1024, 4_000_000
_HEAD = re.compile(r"L(\d+)H(\d+)")
_MIB_HEAD = re.compile(r"a(\d+)\.h(\d+)")


def mib_node(name: str) -> str:
    """Our node name -> MIB's: "L1H3" -> "a1.h3"; "logits" stays."""
    if name == "logits":
        return name
    match = _HEAD.fullmatch(name)
    if not match:
        raise ValueError(f"{name!r} is no head name (L<layer>H<head>) nor 'logits'")
    return f"a{match[1]}.h{match[2]}"


def our_node(name: str) -> str:
    """MIB's head name -> ours: "a1.h3" -> "L1H3"; "logits" stays."""
    if name == "logits":
        return name
    match = _MIB_HEAD.fullmatch(name)
    if not match:
        raise ValueError(f"{name!r} is no MIB head name (a<layer>.h<head>) nor 'logits'")
    return f"L{match[1]}H{match[2]}"


def mib_edge(sender: str, receiver: str) -> str:
    """Our edge (sender "L1H3", receiver "L2H0.v" or "logits") -> MIB's "a1.h3->a2.h0<v>"."""
    if receiver == "logits":
        return f"{mib_node(sender)}->logits"
    head, _, port = receiver.partition(".")
    if port not in ("q", "k", "v"):
        raise ValueError(f"receiver {receiver!r} names no q, k or v input")
    return f"{mib_node(sender)}->{mib_node(head)}<{port}>"


def our_edge(name: str) -> tuple[str, str] | None:
    """MIB's edge name -> ours, (sender, receiver); None for an edge we do not score (from the
    input or an MLP, or into an MLP)."""
    sender, _, receiver = name.partition("->")
    if not _MIB_HEAD.fullmatch(sender):
        return None
    if receiver == "logits":
        return our_node(sender), "logits"
    match = re.fullmatch(r"(a\d+\.h\d+)<([qkv])>", receiver)
    return (our_node(sender), f"{our_node(match[1])}.{match[2]}") if match else None


def mib_graph(n_layers: int, n_heads: int, parallel_attn_mlp: bool = False) -> tuple[list[str], list[str]]:
    """Every node and edge of MIB's graph of a model, in `Graph.from_model`'s order (module doc)."""
    nodes, edges, stream = ["input"], [], ["input"]
    for layer in range(n_layers):
        heads, mlp = [f"a{layer}.h{head}" for head in range(n_heads)], f"m{layer}"
        nodes += [*heads, mlp]
        edges += [f"{src}->{head}<{port}>" for src in stream for head in heads for port in "qkv"]
        if parallel_attn_mlp:
            edges += [f"{src}->{mlp}" for src in stream]
            stream += [*heads, mlp]
        else:
            stream += heads
            edges += [f"{src}->{mlp}" for src in stream]
            stream.append(mlp)
    edges += [f"{src}->logits" for src in stream]
    return [*nodes, "logits"], edges


def mib_edge_count(n_layers: int, n_heads: int, parallel_attn_mlp: bool = False) -> int:
    """How many edges `mib_graph` lists, counted without building them."""
    stream, count = 1, 0  # the nodes written to the residual stream so far
    for _ in range(n_layers):
        count += stream * 3 * n_heads + stream + (0 if parallel_attn_mlp else n_heads)
        stream += n_heads + 1
    return count + stream


def _check_sizes(cfg: Mapping[str, Any]) -> None:
    """ValueError for a cfg whose graph is too large to build (MAX_LAYERS, MAX_HEADS, MAX_EDGES)."""
    for key, most in (("n_layers", MAX_LAYERS), ("n_heads", MAX_HEADS)):
        if cfg[key] > most:
            raise ValueError(f"cfg's {key}={cfg[key]} is beyond what a circuit file can describe; use {key} <= {most}")
    edges = mib_edge_count(cfg["n_layers"], cfg["n_heads"], cfg["parallel_attn_mlp"])
    if edges > MAX_EDGES:
        raise ValueError(f"cfg's graph ({cfg['n_layers']} layers x {cfg['n_heads']} heads) has {edges:,} edges; "
                         f"a circuit file describes at most {MAX_EDGES:,}")


def _node_of_receiver(receiver: str) -> str:
    return receiver.split("<")[0]


def mib_file(cfg: Mapping[str, Any], heads: Iterable[str], kept_edges: Iterable[tuple[str, str]] | None,
             scores: Mapping[tuple[str, str], float], head_scores: Mapping[str, float] | None = None,
             meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One circuit as a MIB file: `heads` (our names) in the graph with every unscored edge
    between nodes in the graph (module doc); of the scored edges (head -> head q/k/v, head ->
    logits) exactly `kept_edges` (our names), or, with `kept_edges` None (no path patching),
    every one between kept heads. `scores`: (sender, receiver) -> path effect, our names (an
    edge without one is written 0.0); `head_scores`: our head name -> node score."""
    missing = [key for key in CFG_KEYS if key not in cfg]
    if missing:
        raise ValueError(f"cfg lacks {missing}; MIB's graph needs {list(CFG_KEYS)}")
    nodes, edges = mib_graph(cfg["n_layers"], cfg["n_heads"], cfg["parallel_attn_mlp"])
    kept_heads = {mib_node(head) for head in heads}
    unknown = kept_heads - set(nodes)
    if unknown:
        raise ValueError(f"heads {sorted(unknown)} are not in a model of {cfg['n_layers']} layers x {cfg['n_heads']} "
                         "heads")
    kept = None if kept_edges is None else {mib_edge(*edge) for edge in kept_edges}
    named = {mib_edge(*edge): float(value) for edge, value in scores.items()}
    bad = [name for name, value in named.items() if not math.isfinite(value)]
    if bad:
        raise ValueError(f"edge scores are not finite at {bad[:3]}: MIB's format needs a number for every edge "
                         f"(the clean and corrupted runs may not differ)")
    in_graph_node = {name: (name in kept_heads) if _MIB_HEAD.fullmatch(name) else True for name in nodes}
    out_nodes: dict[str, dict[str, Any]] = {}
    for name in nodes:
        out_nodes[name] = {"in_graph": in_graph_node[name]}
        if head_scores is not None and _MIB_HEAD.fullmatch(name):
            out_nodes[name]["score"] = float(head_scores[our_node(name)])
    out_edges: dict[str, dict[str, Any]] = {}
    unscored = 0
    for name in edges:
        sender, receiver = name.split("->")
        both = in_graph_node[sender] and in_graph_node[_node_of_receiver(receiver)]
        if our_edge(name) is None:
            unscored += 1
            out_edges[name] = {"score": 0.0, "in_graph": both}
        else:
            out_edges[name] = {"score": named.get(name, 0.0), "in_graph": both if kept is None else name in kept}
    counts = {"nodes": len(nodes), "edges": len(edges), "unscored_edges": unscored,
              "heads_in_graph": len(kept_heads), "scored_edges_in_graph": sum(
                  1 for name, e in out_edges.items() if e["in_graph"] and our_edge(name) is not None)}
    return {"cfg": {key: cfg[key] for key in CFG_KEYS}, "nodes": out_nodes, "edges": out_edges,
            "meta": {**counts, **dict(meta or {})}}


def top_edges(scores: Mapping[tuple[str, str], float], k: int) -> list[tuple[str, str]]:
    """The k edges of largest |score|, ties by name: `interp.circuit.edge_curve`'s order."""
    return sorted(scores, key=lambda edge: (-abs(scores[edge]), edge))[:k]


def threshold_circuits(cfg: Mapping[str, Any], scores: Mapping[tuple[str, str], float],
                       head_scores: Mapping[str, float] | None = None, meta: Mapping[str, Any] | None = None,
                       curve: Mapping[int, float] | None = None) -> dict[float, dict[str, Any]]:
    """MIB's edge budgets (`MIB_PERCENTAGES`) -> a MIB file each: every head kept and the top
    k = int(pct * n_scored) scored edges (module doc); `curve` (k -> faithfulness with every head
    and those k edges, `Circuit.edge_sizes`/`edge_curve`) fills meta["faithfulness"] where measured."""
    heads = [f"L{layer}H{head}" for layer in range(cfg["n_layers"]) for head in range(cfg["n_heads"])]
    files = {}
    for pct in MIB_PERCENTAGES:
        k = int(pct * len(scores))
        budget = {"percent": round(100 * pct, 1), "k": k, "of_scored_edges": len(scores),
                  "faithfulness": None if curve is None else curve.get(k)}
        files[pct] = mib_file(cfg, heads, top_edges(scores, k), scores, head_scores, {**dict(meta or {}), **budget})
    return files


def check_mib(data: Any) -> None:
    """ValueError naming what keeps `data` from being a MIB circuit file that EAP-IG's
    `Graph.from_json` reads: its keys, the cfg's, every node and edge name against the graph that
    cfg gives, and the keys and types of every entry."""
    if not isinstance(data, dict) or any(key not in data for key in FILE_KEYS):
        raise ValueError(f"a MIB circuit file is an object with keys {list(FILE_KEYS)}; got "
                         f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    cfg = data["cfg"]
    if not isinstance(cfg, dict) or any(key not in cfg for key in CFG_KEYS):
        raise ValueError(f"cfg must hold {list(CFG_KEYS)}; got {cfg!r}")
    if not all(isinstance(cfg[key], int) and not isinstance(cfg[key], bool) and cfg[key] > 0
               for key in ("n_layers", "n_heads", "d_model")) or not isinstance(cfg["parallel_attn_mlp"], bool):
        raise ValueError("cfg's n_layers, n_heads and d_model must be positive integers, parallel_attn_mlp a boolean: "
                         f"{cfg}")
    _check_sizes(cfg)
    nodes, edges = mib_graph(cfg["n_layers"], cfg["n_heads"], cfg["parallel_attn_mlp"])
    for kind, entries, names, keys in (("node", data["nodes"], set(nodes), ("in_graph",)),
                                       ("edge", data["edges"], set(edges), ("score", "in_graph"))):
        if not isinstance(entries, dict):
            raise ValueError(f"{kind}s must be an object name -> entry")
        unknown = [name for name in entries if name not in names]
        if unknown:
            raise ValueError(f"{len(unknown)} {kind} name(s) are not in MIB's graph of this cfg, e.g. {unknown[:3]}")
        for name, entry in entries.items():
            if not isinstance(entry, dict) or any(key not in entry for key in keys):
                raise ValueError(f"{kind} {name!r} must be an object with {list(keys)}; got {entry!r}")
            if not isinstance(entry["in_graph"], bool):
                raise ValueError(f"{kind} {name!r}: in_graph must be true or false, got {entry['in_graph']!r}")
            score = entry.get("score")
            if "score" in entry and (isinstance(score, bool) or not isinstance(score, (int, float))
                                     or not math.isfinite(score)):
                raise ValueError(f"{kind} {name!r}: score must be a finite number, got {score!r}")


def write_mib(path: str | Path, data: dict[str, Any]) -> Path:
    """`data` (checked first) as strict JSON at `path`, written atomically."""
    from models.runs import atomic_write_bytes

    check_mib(data)
    path = Path(path)
    atomic_write_bytes(path, json.dumps(data, allow_nan=False).encode())
    return path


def read_mib(path: str | Path) -> dict[str, Any]:
    """A MIB circuit file of at most JSON_LIMIT bytes (64 MiB; RunFolderError beyond), checked
    (`check_mib`; ValueError naming the file)."""
    from models.safe_files import JSON_LIMIT, read_json

    data = read_json(Path(path), limit=JSON_LIMIT)
    try:
        check_mib(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return data


def mib_circuit(data: Mapping[str, Any]) -> dict[str, Any]:
    """What a MIB file holds, in our names: "heads" in the graph (layer, head order), "edges" the
    scored edges in the graph [(sender, receiver, score)], strongest first, "scores" every scored
    edge's score by (sender, receiver); "other_nodes_out" names the input and MLP nodes out of the
    graph, "other_edges_out" the unscored edges out of it though both their ends are in: what our
    circuits never cut (both empty for our own files)."""
    heads = [our_node(name) for name, node in data["nodes"].items() if _MIB_HEAD.fullmatch(name) and node["in_graph"]]
    in_graph = {name: node["in_graph"] for name, node in data["nodes"].items()} | {"logits": True}
    scores, kept, other_out = {}, [], []
    for name, edge in data["edges"].items():
        ours = our_edge(name)
        if ours is None:
            sender, receiver = name.split("->")
            both_in = in_graph.get(sender, False) and in_graph.get(_node_of_receiver(receiver), False)
            if not edge["in_graph"] and both_in:
                other_out.append(name)
            continue
        scores[ours] = edge["score"]
        if edge["in_graph"]:
            kept.append((*ours, edge["score"]))
    kept.sort(key=lambda e: (-abs(e[2]), e[0], e[1]))
    nodes_out = [name for name, node in data["nodes"].items() if not _MIB_HEAD.fullmatch(name) and not node["in_graph"]
                 and name != "logits"]
    return {"heads": heads, "edges": kept, "scores": scores, "other_nodes_out": nodes_out, "other_edges_out": other_out}
