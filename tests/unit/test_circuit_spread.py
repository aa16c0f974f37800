"""The bootstrap of a circuit over its prompt pairs (interp/circuit_spread.py)."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import interp.circuit_spread as spread
from interp.circuit import Circuit
from interp.circuit_spread import bootstrap_circuit, bootstrap_html
from interp.patching import LogitDiff
from tests.fixtures.make_fixtures import OUT, load_fixture


def test_the_stable_core_of_a_known_circuit_is_that_circuit():
    truth = load_fixture(OUT / "two_hop_chain_noisy")
    pairs = truth.pairs
    args = (truth.model, pairs.clean, pairs.corrupted, pairs.logit_diff())
    found = bootstrap_circuit(*args, n_resamples=6, seed=3)
    assert found["stable"]["nodes"] == sorted(truth.nodes)
    assert {tuple(edge.split("->")) for edge in found["stable"]["edges"]} == set(truth.edges)
    distractors = set(found["node_share"]) - set(truth.nodes)
    # the noise lets a distractor in on some resample (L0H1: 1 of 6), never into the core
    assert distractors and all(found["node_share"][head] < 0.9 for head in distractors)
    assert all(round(share * 6, 3) == int(round(share * 6)) for share in found["node_share"].values())
    assert found["intervals"]["faithfulness"][0] < found["intervals"]["faithfulness"][1]
    for name, interval in found["intervals"].items():
        assert interval is not None and interval[0] <= interval[1] and len(found["samples"][name]) == 6, name
    assert found["edges"] and found["pairs"] == len(pairs.clean)
    nodes_only = bootstrap_circuit(*args, n_resamples=3, seed=3, edges=False)
    assert not nodes_only["edges"] and nodes_only["edge_share"] == {} and nodes_only["intervals"]["edge_cpr"] is None
    assert nodes_only["samples"]["faithfulness"] == found["samples"]["faithfulness"][:3]  # the same seeded draws
    again = bootstrap_circuit(*args, n_resamples=3, seed=3, edges=False)
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in nodes_only.items() if k != "seconds"}


def test_shares_and_intervals_are_counted_over_resamples_of_aligned_pairs(monkeypatch):
    n_pairs, calls = 10, []
    tokens = torch.arange(n_pairs).view(-1, 1).repeat(1, 3)  # row i starts with i
    metric = LogitDiff(torch.arange(n_pairs), torch.arange(n_pairs) + 100, torch.arange(n_pairs) + 200)

    def fake(model, clean, corrupted, metric, edges, **options):
        # every resample holds n_pairs rows of the original, the metric's rows drawn with the tokens'
        assert clean.shape == (n_pairs, 3) and torch.equal(clean, corrupted)
        assert torch.equal(metric.pos, clean[:, 0]) and torch.equal(metric.clean_label, clean[:, 0] + 100)
        i = len(calls)
        calls.append(clean[:, 0].tolist())
        nodes = ["L0H0"] + (["L1H1"] if i == 0 else [])
        edges = [("L0H0", "logits", 0.5)] + ([("L0H0", "L1H1.q", 0.1)] if i < 3 else [])
        circuit = Circuit(nodes, edges, i / 40, 0.9, curve=[0.0, 1.0], edge_faithfulness=0.5)
        return spread.MeasuredCircuit(circuit, {}, {}, None, {})

    monkeypatch.setattr(spread, "circuit_on_pairs", fake)
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, n_heads=2, d_model=8, d_head=4, n_ctx=3, d_vocab=300,
                                                      act_fn="relu"))
    found = bootstrap_circuit(model, tokens, tokens, metric, n_resamples=41, seed=1)
    assert len(calls) == 41 and len({tuple(c) for c in calls}) > 1 and any(len(set(c)) < n_pairs for c in calls)
    assert found["node_share"] == {"L0H0": 1.0, "L0H1": 0.0, "L1H0": 0.0, "L1H1": round(1 / 41, 4)}
    assert found["edge_share"] == {"L0H0->logits": 1.0, "L0H0->L1H1.q": round(3 / 41, 4)}
    assert found["stable"] == {"share": 0.9, "nodes": ["L0H0"], "edges": ["L0H0->logits"]}
    assert found["intervals"]["faithfulness"] == [0.025, 0.975]  # values 0/40 .. 40/40: the 2.5 and 97.5 percentiles
    assert found["intervals"]["size"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="LogitDiff"):
        bootstrap_circuit(model, tokens, tokens, lambda logits: logits[:, 0, 0], n_resamples=4)


def test_the_report_paragraph_names_the_intervals_and_the_stable_core():
    circuit = {"nodes": ["L0H0", "L1H1"], "faithfulness": 0.97, "ablation": "resample", "edge_faithfulness": 0.93,
               "areas": {"nodes": {"resample": {"cpr": 0.8, "cmd": 0.2}}, "edges": {"cpr": 0.9, "cmd": 0.1}}}
    assert bootstrap_html(circuit) == ""
    circuit["bootstrap"] = {
        "resamples": 20, "pairs": 64, "seed": 0, "edges": True, "percentiles": [2.5, 97.5],
        "intervals": {"faithfulness": [0.9, 0.99], "size": [2, 3], "cpr": [0.7, 0.85], "cmd": [0.15, 0.3],
                      "edge_faithfulness": [0.88, 0.95], "edge_cpr": [0.85, 0.92], "edge_cmd": [0.08, 0.15]},
        "node_share": {"L0H0": 1.0, "L1H1": 0.85, "L1H0": 0.0},
        "edge_share": {"L0H0->logits": 0.95, "L0H0->L1H1.v": 0.4},
        "stable": {"share": 0.9, "nodes": ["L0H0"], "edges": ["L0H0->logits"]}}
    text = bootstrap_html(circuit)
    assert "faithfulness of the heads 0.97 [0.90, 0.99]" in text and "CPR over heads 0.80 [0.70, 0.85]" in text
    assert "heads L0H0; edges L0H0-&gt;logits" in text and "L1H1 0.85" in text and "L0H0-&gt;L1H1.v 0.40" in text
