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
    circuit = find_circuit(model, clean, corrupted, metric, effects, paths, target=0.6, rule="first")
    k = len(circuit.nodes)
    assert circuit.rule == "first" and circuit.faithfulness == circuit.curve[k] == circuit.curves["resample"][k]
    assert all(value < 0.6 for value in circuit.curve[:k]) and (circuit.reached or k == 6)
    # "stays": the shortest prefix from which the curve stays at the target; this model's curve
    # reaches 0.6, dips below it and comes back, so it keeps more heads than "first"
    stays = find_circuit(model, clean, corrupted, metric, effects, None, target=0.6)  # the default
    j = len(stays.nodes)
    assert stays.rule == "stays"
    assert stays.curve == circuit.curve and all(value >= 0.6 for value in stays.curve[j:])
    assert stays.curve[j - 1] < 0.6 and j > k and stays.nodes[:k] == circuit.nodes
    assert circuit.sizes_by_rule() == stays.sizes_by_rule() and circuit.sizes_by_rule()["stays"] == j
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

    edges = [("L1H0", "L2H1.v", 0.3), ("L2H1", "L3H0.k", 0.2), ("L3H0", "logits", 0.5),
             ("L0H1", "L2H1.q", 0.1), ("L2H1", "logits", 0.4), ("L0H0", "L1H1.v", 0.9)]
    chains = chains_to_logits(edges)
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
    assert by_mean.curves["mean"] == by_mean.curve and by_mean.curves["resample"] == circuit.curve
    with pytest.raises(ValueError, match="ablation 'zero' is unknown"):
        kept_faithfulness(model, clean, corrupted, metric, [kept], ablation="zero")
    with pytest.raises(ValueError, match="rule 'any' is unknown"):
        find_circuit(model, clean, corrupted, metric, effects, None, rule="any")


def test_each_rule_picks_its_size_from_the_curves_and_a_cancelling_pair_fools_only_the_first():
    from interp.circuit import circuit_size

    # the cancellation fixture's shape: one head keeps "100%" while the two feeding it cancel when resampled
    curves = {"resample": [0.0, 1.0, 0.5, 0.5, 1.0, 1.0], "mean": [0.5, 0.75, 0.75, 0.75, 1.0, 1.0]}
    assert circuit_size(curves, "resample", 0.9, "first") == 1
    assert circuit_size(curves, "resample", 0.9, "stays") == 4
    assert circuit_size(curves, "resample", 0.9, "both") == 4
    assert circuit_size(curves, "mean", 0.9, "first") == 4
    # mean ablation that never reaches the target until every head is kept: "both" keeps them all
    curves = {"resample": [0.0, 0.95, 0.97, 1.0], "mean": [0.5, 0.5, 0.5, 1.0]}
    assert [circuit_size(curves, "resample", 0.9, rule) for rule in ("first", "stays", "both")] == [1, 1, 3]
    # a curve that never reaches the target: the whole model
    curves = {"resample": [0.0, 0.3, 0.8], "mean": [0.0, 0.3, 0.8]}
    assert [circuit_size(curves, "resample", 0.9, rule) for rule in ("first", "stays", "both")] == [2, 2, 2]


def test_both_rule_keeps_heads_and_edges_faithful_under_both_ablations():
    model, clean, corrupted, metric = setup(seed=1)
    effects = patch_head_out(model, clean, corrupted, metric).values
    paths = path_patch(model, clean, corrupted, metric)
    circuit = find_circuit(model, clean, corrupted, metric, effects, paths, target=0.6, rule="both")
    k = len(circuit.nodes)
    lowest = [min(r, m) for r, m in zip(circuit.curves["resample"], circuit.curves["mean"])]
    assert lowest[k] >= 0.6 and all(value < 0.6 for value in lowest[:k]) and circuit.reached
    assert circuit.faithfulness_mean == circuit.curves["mean"][k]
    assert circuit.edge_faithfulness >= 0.6 - 1e-6 and circuit.edge_faithfulness_mean >= 0.6 - 1e-6


def test_faithfulness_areas_are_cpr_and_cmd_over_the_share_kept():
    from interp.circuit import faithfulness_areas

    assert faithfulness_areas([1.0, 1.0, 1.0]) == (1.0, 0.0)
    assert faithfulness_areas([0.0, 1.0]) == (0.5, 0.5)
    assert faithfulness_areas([0.0, 1.0, 1.0]) == (0.75, 0.25)
    cpr, cmd = faithfulness_areas([0.0, 2.0])  # crosses 1 at x = 0.5: two triangles of 0.25
    assert cpr == pytest.approx(1.0) and cmd == pytest.approx(0.5)
    cpr, cmd = faithfulness_areas([0.0, 1.0, 1.0], sizes=[0, 1, 4], total=4)  # measured at 0, 1 and 4 of 4
    assert cpr == pytest.approx(0.125 + 0.75) and cmd == pytest.approx(0.125)
    with pytest.raises(ValueError, match="two or more sizes"):
        faithfulness_areas([1.0])


def test_the_circuit_has_its_curves_as_attributes_and_writes_its_areas_and_rule():
    model, clean, corrupted, metric = setup(seed=1)
    effects = patch_head_out(model, clean, corrupted, metric).values
    paths = path_patch(model, clean, corrupted, metric)
    circuit = find_circuit(model, clean, corrupted, metric, effects, paths, target=0.6)
    written = circuit.to_dict()
    assert set(written) == {"nodes", "edges", "faithfulness", "target", "curve", "order", "ablation",
                            "faithfulness_mean", "edge_faithfulness", "edge_faithfulness_mean",
                            "no_edge_faithfulness", "candidate_edges", "reached", "rule", "areas"}  # analysis.json's
    areas = circuit.areas()
    assert written["areas"] == areas and written["rule"] == "stays"
    assert set(areas["nodes"]) == {"resample", "mean"} and areas["nodes"]["resample"]["cpr"] == round(circuit.cpr, 4)
    n_edges = 2 * (4 * 3 + 1) + 2 * (2 * 3 + 1) + 2  # 3 layers of 2 heads: into later heads' q/k/v, and the logits
    assert circuit.n_edges == n_edges == circuit.edge_sizes[-1] and circuit.edge_sizes == list(range(n_edges + 1))
    assert abs(circuit.edge_curve[-1] - 1) <= 1e-4  # every edge kept: the clean run
    assert areas["edges"]["cpr"] == round(circuit.edge_cpr, 4) and circuit.edge_cmd >= 0
    no_paths = find_circuit(model, clean, corrupted, metric, effects, None, target=0.6)
    assert no_paths.n_edges == 0 and no_paths.edge_cpr is None and no_paths.areas()["edges"] is None


def test_every_edge_kept_is_the_node_sets_faithfulness_and_none_kept_is_measured():
    from interp.circuit import candidate_edges, edge_faithfulness

    model, clean, corrupted, metric = setup(seed=2)
    nodes = {(0, 1), (1, 0), (2, 1)}
    edges = set(candidate_edges(nodes))
    assert len(edges) == 3 * 2 + 3 * 1 + 3  # L0 -> two later heads, L1 -> one, each q/k/v; three to the logits
    everything, nothing = edge_faithfulness(model, clean, corrupted, metric, nodes, [edges, set()])
    [node_set] = kept_faithfulness(model, clean, corrupted, metric, [nodes])
    assert abs(everything - node_set) <= 1e-5 and abs(nothing - node_set) > 1e-3
    assert not model.cfg.use_split_qkv_input  # the model is left as it was


def test_an_ablated_edge_feeds_its_receiver_the_senders_corrupted_output_and_nothing_else():
    """By hand: with every head kept and every edge but L0H1 -> L2H0.v, head L2H0's value is
    ln1(clean residual - (z_clean - z_corrupted) W_O of L0H1) W_V; everything else is clean."""
    from interp.circuit import candidate_edges, edge_faithfulness

    model, clean, corrupted, metric = setup(seed=3)
    nodes = {(layer, head) for layer in range(3) for head in range(2)}
    cut = ((0, 1), (2, 0, "v"))
    [value] = edge_faithfulness(model, clean, corrupted, metric, nodes, [set(candidate_edges(nodes)) - {cut}])
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    delta = (clean_cache["blocks.0.attn.hook_z"][:, :, 1] - corrupted_cache["blocks.0.attn.hook_z"][:, :, 1]) \
        @ model.blocks[0].attn.W_O[1]
    block = model.blocks[2]
    v = block.ln1(clean_cache["blocks.2.hook_resid_pre"] - delta) @ block.attn.W_V[0] + block.attn.b_V[0]

    def swap(activation, hook):
        activation[:, :, 0] = v
        return activation

    with model.hooks(fwd_hooks=[("blocks.2.attn.hook_v", swap)]):
        patched = metric(model(clean)).mean().item()
    clean_m, corrupted_m = metric(model(clean)).mean().item(), metric(model(corrupted)).mean().item()
    assert abs(value - (patched - corrupted_m) / (clean_m - corrupted_m)) <= 1e-5
    assert abs(value - 1) > 1e-4  # the edge matters at all on this model, so the check has teeth


def test_the_circuits_edges_are_pruned_weakest_first_and_keep_the_target():
    from interp.circuit import candidate_edges, edge_faithfulness

    model, clean, corrupted, metric = setup(seed=1)
    effects = patch_head_out(model, clean, corrupted, metric).values
    paths = path_patch(model, clean, corrupted, metric)
    circuit = find_circuit(model, clean, corrupted, metric, effects, paths, target=0.6)
    nodes = {(int(n[1]), int(n[3])) for n in circuit.nodes}
    names = {(f"L{s[0]}H{s[1]}", r if r == "logits" else f"L{r[0]}H{r[1]}.{r[2]}"): (s, r)
             for s, r in candidate_edges(nodes)}
    assert circuit.candidate_edges == len(names) and len(circuit.edges) <= len(names)
    kept = {names[(s, r)] for s, r, _ in circuit.edges}
    resample, mean = (edge_faithfulness(model, clean, corrupted, metric, nodes, [kept], a)[0]
                      for a in ("resample", "mean"))
    assert circuit.edge_faithfulness == round(resample, 4) and circuit.edge_faithfulness_mean == round(mean, 4)
    assert circuit.edge_faithfulness >= min(0.6, circuit.faithfulness) - 1e-6
    assert len(kept) < len(names)  # some edges were not needed, and were dropped
    no_edge = edge_faithfulness(model, clean, corrupted, metric, nodes, [set()])[0]
    assert circuit.no_edge_faithfulness == round(no_edge, 4)
    values = [abs(v) for _, _, v in circuit.edges]
    assert values == sorted(values, reverse=True)


def test_pruning_tries_edges_weakest_path_effect_first_and_keeps_those_it_cannot_drop(monkeypatch):
    import interp.circuit as circuit_module

    model, clean, corrupted, metric = setup(seed=1)
    nodes = {(0, 1), (1, 0), (2, 1)}
    edges = circuit_module.candidate_edges(nodes)
    strength = {circuit_module.edge_name(e): (i * 7 % len(edges)) / 10 - 0.6 for i, e in enumerate(edges)}
    needed = ((1, 0), (2, 1, "v"))
    measured = []

    def faithfulness(model, clean, metric, nodes, kept, stand_ins):  # 1 while `needed` is kept
        measured.append(set(kept[0]))
        return [1.0 if needed in kept[0] else 0.0]

    monkeypatch.setattr(circuit_module, "_edge_values", faithfulness)
    kept, value = circuit_module.prune_edges(model, clean, corrupted, metric, nodes, strength, 0.9)
    assert kept == {needed} and value == 1.0
    current, tried = measured[0], []  # the first measurement is of every edge; then one removal per call
    for candidate in measured[1:]:
        [edge] = current - candidate
        tried.append(edge)
        if edge != needed:
            current = candidate
    assert tried == sorted(edges,
                           key=lambda e: (abs(strength[circuit_module.edge_name(e)]), circuit_module.edge_name(e)))


def test_circuit_chains_mark_planted_heads_including_every_layers():
    """"*.0" plants head 0 of every layer: each is marked planted where a chain names it."""
    from interp.analysis import _planted_names
    from interp.attention import HeadScores
    from interp.task_analysis import named_chain

    heads = HeadScores(torch.zeros(4, 3, 2), [["a", "b"], ["c", "d"], ["e", "f"]], {})
    planted = _planted_names({"*.0": "broadcast", "1.1": "association"}, heads)
    assert planted == {"L0H0", "L1H0", "L2H0", "L1H1"}
    chain = named_chain(["L0H1", "L1H1", "L2H0", "logits"], {"L0H1": "mixed", "L1H1": "association", "L2H0": "c"},
                         planted)
    assert chain == "L0H1 (mixed) -> L1H1 (association, planted) -> L2H0 (c, planted) -> logits"
