"""MIB's circuit file format (interp/mib.py): the graph it names, our circuits written in it and
read back, and the checks a file must pass to be read by MIB's code."""

import json
import math

import pytest

from interp.circuit import candidate_edges, edge_name
from interp.circuit_compare import mib_files
from interp.circuit_spread import circuit_on_pairs
from interp.mib import (
    MIB_PERCENTAGES,
    check_mib,
    mib_circuit,
    mib_edge,
    mib_edge_count,
    mib_file,
    mib_graph,
    our_edge,
    read_mib,
    threshold_circuits,
    write_mib,
)
from tests.fixtures.make_fixtures import OUT, load_fixture

CFG = {"n_layers": 3, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
HEADS = [f"L{layer}H{head}" for layer in range(3) for head in range(2)]


def every_scored_edge(n_layers=3, n_heads=2):
    return [edge_name(e)
            for e in candidate_edges({(layer, head) for layer in range(n_layers) for head in range(n_heads)})]


def scores_for(edges):
    """Distinct, signed scores, no two of the same size."""
    return {edge: (-1) ** i * (i + 1) / 100 for i, edge in enumerate(edges)}


def test_the_graph_is_mibs_published_one():
    # github.com/hannamw/MIB-circuit-track circuits/ioi-eap-ig.json (GPT-2 small, 12 x 12): 158 nodes, 32,491
    # edges, from "input->a0.h0<q>" to "m11->logits"
    nodes, edges = mib_graph(12, 12)
    assert (len(nodes), len(edges)) == (158, 32491)
    assert nodes[:3] == ["input", "a0.h0", "a0.h1"] and nodes[-2:] == ["m11", "logits"]
    assert edges[:3] == ["input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>"] and edges[-1] == "m11->logits"
    assert "a3.h1->a3.h2<q>" not in edges and "a3.h1->m3" in edges and "m3->a3.h0<k>" not in edges
    # parallel attention and MLP: the MLP of a layer does not read that layer's heads
    parallel = mib_graph(2, 2, parallel_attn_mlp=True)[1]
    assert "a0.h1->m0" not in parallel and "a0.h1->m1" in parallel
    # every edge we score is one of MIB's, and maps back to itself
    ours = every_scored_edge(12, 12)
    assert {mib_edge(*e) for e in ours} <= set(edges)
    assert all(our_edge(mib_edge(*e)) == e for e in ours)
    assert our_edge("input->a0.h0<q>") is None and our_edge("a0.h0->m0") is None and our_edge("m0->logits") is None


def test_a_circuit_written_and_read_back_is_the_same(tmp_path):
    scores = scores_for(every_scored_edge())
    kept = [("L1H0", "L2H1.q"), ("L1H0", "logits"), ("L2H1", "logits")]
    head_scores = {head: i / 10 for i, head in enumerate(HEADS)}
    data = mib_file(CFG, ["L1H0", "L2H1"], kept, scores, head_scores, {"run": "x"})
    read = read_mib(write_mib(tmp_path / "circuit.json", data))
    assert read == data
    back = mib_circuit(read)
    assert back["heads"] == ["L1H0", "L2H1"]
    assert {(s, r) for s, r, _ in back["edges"]} == set(kept)
    assert back["scores"] == scores and all(score == scores[s, r] for s, r, score in back["edges"])
    assert back["other_nodes_out"] == [] and back["other_edges_out"] == []  # what ours leaves out of the graph
    edges, nodes = read["edges"], read["nodes"]
    # what our circuits never cut is in the graph, wherever both ends are
    assert edges["input->a1.h0<k>"]["in_graph"] and edges["m0->a2.h1<v>"]["in_graph"]
    assert edges["a1.h0->m1"]["in_graph"] and edges["m2->logits"]["in_graph"] and edges["input->m0"]["in_graph"]
    # an ablated head is out, with every edge it sends or receives
    assert not nodes["a0.h0"]["in_graph"] and not edges["a0.h0->m0"]["in_graph"]
    assert not edges["input->a0.h0<q>"]["in_graph"] and not edges["a0.h0->a1.h0<v>"]["in_graph"]
    # a scored edge between kept heads is in only where the circuit kept it
    assert not edges["a1.h0->a2.h1<k>"]["in_graph"] and edges["a1.h0->a2.h1<q>"]["in_graph"]
    assert nodes["a2.h1"] == {"in_graph": True, "score": 0.5} and nodes["m1"] == {"in_graph": True}
    assert read["meta"]["unscored_edges"] + len(scores) == len(edges) and read["meta"]["scored_edges_in_graph"] == 3


def test_without_edge_scores_every_edge_between_kept_heads_is_in():
    data = mib_file(CFG, ["L0H1", "L2H0"], None, {}, None)
    kept = [name for name, e in data["edges"].items() if e["in_graph"] and our_edge(name)]
    assert sorted(kept) == ["a0.h1->a2.h0<k>", "a0.h1->a2.h0<q>", "a0.h1->a2.h0<v>", "a0.h1->logits", "a2.h0->logits"]
    assert all(e["score"] == 0.0 for e in data["edges"].values()) and "score" not in data["nodes"]["a0.h1"]


def test_files_follow_the_documented_keys_and_bad_ones_are_refused():
    data = mib_file(CFG, ["L1H0"], [("L1H0", "logits")], scores_for(every_scored_edge()), {h: 0.0 for h in HEADS})
    check_mib(data)
    assert set(data) >= {"cfg", "nodes", "edges"}
    assert set(data["cfg"]) == {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"}
    assert all(set(e) == {"score", "in_graph"} and isinstance(e["in_graph"], bool) and isinstance(e["score"], float)
               for e in data["edges"].values())
    assert all(set(n) <= {"in_graph", "score"} for n in data["nodes"].values())
    json.dumps(data, allow_nan=False)  # strict JSON

    def broken(change):
        bad = json.loads(json.dumps(data))
        change(bad)
        return bad

    for change, words in [(lambda d: d.pop("edges"), "keys"), (lambda d: d["cfg"].pop("d_model"), "cfg"),
                          (lambda d: d["edges"].update({"a2.h0->a1.h0<q>": {"score": 0.0, "in_graph": True}}),
                           "not in MIB"),
                          (lambda d: d["edges"]["a1.h0->logits"].pop("score"), "score"),
                          (lambda d: d["edges"]["a1.h0->logits"].update(in_graph=1), "in_graph"),
                          (lambda d: d["edges"]["a1.h0->logits"].update(score=math.inf), "finite"),
                          (lambda d: d["nodes"].update({"a5.h0": {"in_graph": True}}), "not in MIB")]:
        with pytest.raises(ValueError, match=words):
            check_mib(broken(change))
    with pytest.raises(ValueError, match="not finite"):
        mib_file(CFG, ["L1H0"], [], {("L1H0", "logits"): math.nan}, None)


def test_each_edge_budget_keeps_the_strongest_scored_edges_and_every_head():
    edges = every_scored_edge()
    scores = scores_for(edges)  # |score| grows with the index
    files = threshold_circuits(CFG, scores, None, {"run": "x"}, curve={0: 0.1, 6: 0.7})
    assert list(files) == list(MIB_PERCENTAGES)
    for pct, data in files.items():
        k = int(pct * len(edges))
        kept = {our_edge(name) for name, e in data["edges"].items() if e["in_graph"] and our_edge(name)}
        assert kept == set(edges[len(edges) - k:]) if k else not kept
        assert all(node["in_graph"] for node in data["nodes"].values())
        assert all(e["in_graph"] for name, e in data["edges"].items() if our_edge(name) is None)
        assert data["meta"]["k"] == k and data["meta"]["faithfulness"] == {0: 0.1, 6: 0.7}.get(k)


def test_a_found_circuit_round_trips_through_mib_files(tmp_path):
    truth = load_fixture(OUT / "two_hop_chain")
    pairs = truth.pairs
    found = circuit_on_pairs(truth.model, pairs.clean, pairs.corrupted, pairs.logit_diff())
    files = mib_files(found, {"run": "two_hop_chain"})
    assert set(files) == {"circuit.json", *(f"edges-{100 * p:g}pct.json" for p in MIB_PERCENTAGES)}
    for name, data in files.items():
        assert read_mib(write_mib(tmp_path / name, data)) == data
    back = mib_circuit(read_mib(tmp_path / "circuit.json"))
    assert sorted(back["heads"]) == sorted(found.circuit.nodes) == sorted(truth.nodes)
    assert {(s, r) for s, r, _ in back["edges"]} == {(s, r) for s, r, _ in found.circuit.edges} == set(truth.edges)
    assert back["scores"] == found.edge_scores
    assert {name: node["score"] for name, node in read_mib(tmp_path / "circuit.json")["nodes"].items()
            if "score" in node} == {f"a{h[1]}.h{h[3]}": v for h, v in found.head_scores.items()}


@pytest.mark.parametrize("cfg, words", [
    ({"n_layers": 1_000_000, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 8}, "n_layers=1000000"),
    ({"n_layers": 2, "n_heads": 10**9, "parallel_attn_mlp": False, "d_model": 8}, "n_heads=1000000000"),
    ({"n_layers": 1024, "n_heads": 1024, "parallel_attn_mlp": False, "d_model": 8}, "edges"),
])
def test_a_cfg_too_large_for_a_graph_is_refused_before_the_graph_is_built(tmp_path, cfg, words):
    """A 115-byte file whose cfg asks for a million layers took circuit-compare past 3 GB."""
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps({"cfg": cfg, "nodes": {}, "edges": {}}))
    with pytest.raises(ValueError, match=words) as caught:
        read_mib(path)
    assert str(path) in str(caught.value)


def test_a_mib_file_beyond_64_mib_is_refused_unread(tmp_path):
    from models.safe_files import RunFolderError

    path = tmp_path / "circuit.json"
    with open(path, "wb") as f:  # sparse: no disk space
        f.truncate((64 << 20) + 1)
    with pytest.raises(RunFolderError, match="circuit.json"):
        read_mib(path)


def test_the_edge_count_is_the_graphs():
    for n_layers, n_heads, parallel in [(1, 1, False), (3, 2, False), (4, 4, True), (2, 5, True)]:
        assert mib_edge_count(n_layers, n_heads, parallel) == len(mib_graph(n_layers, n_heads, parallel)[1])
