"""The circuit graph: faithfulness of kept heads, measured against hand-made ablations."""

import xml.etree.ElementTree as ET

import pytest
import torch

from interp.circuit import circuit_svg, find_circuit, kept_faithfulness
from interp.patching import logit_diff_metric, patch_head_out
from interp.paths import path_patch
from models.config import ModelConfig
from models.factory import build_model
from tasks import LegoConfig, LegoTask, seeded_generator

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))


def setup(seed=0):
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, planted={"1.0": "association"}), LEGO, seed=seed)
    clean, corrupted, _ = LEGO.counterfactual_pairs(16, seeded_generator(seed))
    return model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, label_index=1)


def test_faithfulness_is_one_with_every_head_and_matches_a_hand_made_ablation():
    model, clean, corrupted, metric = setup()
    everything = {(layer, head) for layer in range(3) for head in range(2)}
    one = {(1, 0), (2, 1)}
    full, partial = kept_faithfulness(model, clean, corrupted, metric, [everything, one])
    assert abs(full - 1) <= 1e-5
    _, cache = model.run_with_cache(corrupted)

    def ablate(z, hook):  # every head but the kept ones takes its corrupted output
        for head in range(2):
            if (hook.layer(), head) not in one:
                z[:, :, head] = cache[hook.name][:, :, head]
        return z

    with model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), ablate)]):
        kept = metric(model(clean)).mean().item()
    clean_m, corrupted_m = metric(model(clean)).mean().item(), metric(model(corrupted)).mean().item()
    assert abs(partial - (kept - corrupted_m) / (clean_m - corrupted_m)) <= 1e-5


def test_the_circuit_is_the_shortest_prefix_that_reaches_the_target_and_its_edges_stay_inside():
    model, clean, corrupted, metric = setup(seed=1)
    effects = patch_head_out(model, clean, corrupted, metric).values
    paths = path_patch(model, clean, corrupted, metric)
    circuit = find_circuit(model, clean, corrupted, metric, effects, paths, target=0.6, edge_threshold=0.0)
    k = len(circuit.nodes)
    assert circuit.faithfulness == circuit.curve[k]
    assert all(value < 0.6 for value in circuit.curve[:k]) and (circuit.reached or k == 6)
    magnitudes = [abs(effects[int(n[1]), int(n[3])].item()) for n in circuit.order]
    assert magnitudes == sorted(magnitudes, reverse=True)
    for sender, receiver, _ in circuit.edges:
        assert sender in circuit.nodes and (receiver == "logits" or receiver.split(".")[0] in circuit.nodes)
    svg = circuit_svg(circuit.to_dict(), 3, 2, [["a", "b"], ["association", "m"], ["x", "y"]])
    root = ET.fromstring(svg)  # well-formed
    assert sum(1 for el in root.iter() if el.tag.endswith("circle")) == 6
    assert len([el for el in root.iter() if el.tag.endswith("line")]) == len(circuit.edges)


def test_chains_to_logits_follow_edges_back_from_the_logits_longest_first():
    from interp.circuit import chains_to_logits, loop_steps

    circuit = {"edges": [["L1H0", "L2H1.v", 0.3], ["L2H1", "L3H0.k", 0.2], ["L3H0", "logits", 0.5],
                         ["L0H1", "L2H1.q", 0.1], ["L2H1", "logits", 0.4], ["L0H0", "L1H1.v", 0.9]]}
    chains = chains_to_logits(circuit)
    assert chains[0] == ["L1H0", "L2H1", "L3H0", "logits"]  # same length: its weakest edge (0.2) beats 0.1
    assert ["L3H0", "logits"] in chains and ["L2H1", "logits"] in chains
    assert not any("L1H1" in chain for chain in chains)  # L1H1 reaches no logits
    kinds = {"L1H0": "association", "L2H1": "manipulation", "L3H0": "association", "L0H1": "manipulation"}
    assert loop_steps(chains[0], kinds) == [("L1H0", "L2H1"), ("L2H1", "L3H0")]
    assert loop_steps(["L0H1", "L2H1", "logits"], kinds) == []  # layers 0 -> 2 are not consecutive


def test_mean_ablation_replaces_dropped_heads_by_their_mean_output_per_position():
    model, clean, corrupted, metric = setup(seed=1)
    one = {(1, 0), (2, 1)}
    [partial] = kept_faithfulness(model, clean, corrupted, metric, [one], ablation="mean")
    _, cache = model.run_with_cache(torch.cat([clean, corrupted]))

    def ablate(z, hook):  # by hand: a loop over heads, the mean over all 2n inputs at each position
        for head in range(2):
            if (hook.layer(), head) not in one:
                z[:, :, head] = cache[hook.name][:, :, head].mean(0)
        return z

    with model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), ablate)]):
        kept = metric(model(clean)).mean().item()
    clean_m, corrupted_m = metric(model(clean)).mean().item(), metric(model(corrupted)).mean().item()
    assert abs(partial - (kept - corrupted_m) / (clean_m - corrupted_m)) <= 1e-5
    [resampled] = kept_faithfulness(model, clean, corrupted, metric, [one])
    assert abs(partial - resampled) > 1e-3  # a different ablation, a different number


def test_the_circuit_reports_its_heads_under_mean_ablation_and_refuses_unknown_ablations():
    model, clean, corrupted, metric = setup(seed=1)
    effects = patch_head_out(model, clean, corrupted, metric).values
    circuit = find_circuit(model, clean, corrupted, metric, effects, None, target=0.6)
    kept = {(int(n[1]), int(n[3])) for n in circuit.nodes}
    [mean] = kept_faithfulness(model, clean, corrupted, metric, [kept], ablation="mean")
    assert circuit.ablation == "resample" and circuit.faithfulness_mean == round(mean, 4)
    by_mean = find_circuit(model, clean, corrupted, metric, effects, None, target=0.6, ablation="mean")
    assert by_mean.faithfulness == by_mean.faithfulness_mean == by_mean.curve[len(by_mean.nodes)]
    with pytest.raises(ValueError, match="ablation 'zero' is unknown"):
        kept_faithfulness(model, clean, corrupted, metric, [kept], ablation="zero")
