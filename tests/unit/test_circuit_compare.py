"""How much two circuits share (interp/circuit_compare.py), on circuits written by hand."""

import pytest

from interp.circuit import candidate_edges, edge_name
from interp.circuit_compare import compare_circuits, overlap
from interp.mib import MIB_PERCENTAGES, mib_file

CFG = {"n_layers": 3, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
EDGES = [edge_name(e) for e in candidate_edges({(layer, head) for layer in range(3) for head in range(2)})]  # 42


def test_overlap_counts_sets_and_multisets():
    assert overlap({"a", "b", "c"}, {"b", "c", "d", "e"}) == {"a": 3, "b": 4, "shared": 2, "jaccard": 0.4,
                                                              "overlap": 0.6667}
    assert overlap([1, 1, 2], [1, 2, 2]) == {"a": 3, "b": 3, "shared": 2, "jaccard": 0.5, "overlap": 0.6667}
    assert overlap([], []) == {"a": 0, "b": 0, "shared": 0, "jaccard": None, "overlap": None}


def test_heads_swapped_within_a_layer_differ_by_name_and_agree_by_layer():
    scores = {edge: (i + 1) / 100 for i, edge in enumerate(EDGES)}
    a = mib_file(CFG, ["L0H0", "L1H1"], [("L0H0", "L1H1.q"), ("L1H1", "logits")], scores, None)
    b = mib_file(CFG, ["L0H1", "L1H1"], [("L0H1", "L1H1.q"), ("L1H1", "logits")], scores, None)
    result = compare_circuits(a, b)["circuit"]
    assert result["heads"] == {"a": 2, "b": 2, "shared": 1, "jaccard": round(1 / 3, 4), "overlap": 0.5}
    assert result["edges"]["shared"] == 1 and result["edges"]["jaccard"] == round(1 / 3, 4)
    assert result["heads_by_layer"]["jaccard"] == 1.0 and result["edges_by_layer"]["jaccard"] == 1.0


def test_at_each_budget_the_strongest_edges_of_each_circuit_are_compared():
    a_scores = {edge: (i + 1) / 100 for i, edge in enumerate(EDGES)}  # strongest: the last of EDGES
    b_scores = {edge: -2 * value for edge, value in a_scores.items()}  # same order of |score|
    swapped = dict(a_scores)
    swapped[EDGES[-1]], swapped[EDGES[0]] = a_scores[EDGES[0]], a_scores[EDGES[-1]]  # A's strongest is weakest in C
    a, b, c = (mib_file(CFG, [], [], scores, None) for scores in (a_scores, b_scores, swapped))
    same = compare_circuits(a, b)
    assert len(EDGES) == 42 and [t["k"] for t in same["thresholds"]] == [int(p * 42) for p in MIB_PERCENTAGES]
    assert all(t["edges"]["jaccard"] == 1.0 for t in same["thresholds"] if t["k"])
    assert same["edge_score_spearman"] == -1.0  # signed scores, opposite signs
    ten = next(t for t in compare_circuits(a, c)["thresholds"] if t["percent"] == 10)  # the 4 strongest
    assert ten["k"] == 4 and ten["edges"] == {"a": 4, "b": 4, "shared": 3, "jaccard": 0.6, "overlap": 0.75}
    with pytest.raises(ValueError, match="different shapes"):
        compare_circuits(a, mib_file({**CFG, "n_heads": 3}, [], [], {}, None))


def test_circuits_without_edge_scores_are_compared_on_their_circuits_only():
    a = mib_file(CFG, ["L0H0", "L2H1"], None, {}, None)
    result = compare_circuits(a, a)
    assert result["thresholds"] == [] and result["edge_score_spearman"] is None
    assert result["circuit"]["edges"]["jaccard"] == 1.0 and result["circuit"]["edges"]["a"] == 5  # q/k/v + 2 logits
