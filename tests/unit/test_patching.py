import json
import math
import warnings

import pytest
import torch

from analyses.bench.patching import print_report, run_patching_benchmark, unaligned_pairs
from interp.patching import (
    activation_patch,
    attribute_head_out,
    attribute_head_out_by_pos,
    attribute_residual,
    attribution_patch,
    cell_masks,
    logit_diff_metric,
    patch_head_out,
    patch_head_out_by_pos,
    patch_mlp_out,
    patch_residual,
    spearman,
    verification_cost,
)
from models.factory import build_model
from tasks import CompositeConfig, CompositeTask, LegoConfig, LegoTask, seeded_generator
from tests.helpers import TINY_MODEL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformer_lens import patching as tl_patching

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
COMPOSITE = CompositeTask(CompositeConfig())
# our sweep and the TransformerLens function it must reproduce
SWEEPS = [
    (patch_residual, tl_patching.get_act_patch_resid_pre),
    (patch_head_out, tl_patching.get_act_patch_attn_head_out_all_pos),
    (patch_head_out_by_pos, tl_patching.get_act_patch_attn_head_out_by_pos),
    (patch_mlp_out, tl_patching.get_act_patch_mlp_out),
]


def counterfactual_setup(task, n=8, seed=0):
    """A tiny random model and real pairs from task.corrupt(): LEGO changes chain depth 1 and
    reads variable #2 (changed), composite changes the key and reads the answer."""
    model = build_model(TINY_MODEL, task, seed=seed)
    gen = seeded_generator(seed)
    clean = task.sample(n, gen, split="test")
    if task is LEGO:
        corrupted, _ = task.corrupt(clean, gen, depth=1)
        label_index = 2
    else:
        corrupted, _ = task.corrupt(clean, gen, change="key")
        label_index = 0
    return model, clean, corrupted, logit_diff_metric(clean, corrupted, label_index)


@pytest.mark.parametrize("direction", ["clean_to_corrupted", "corrupted_to_clean"])
@pytest.mark.parametrize("ours, theirs", SWEEPS, ids=[s[0].__name__ for s in SWEEPS])
@pytest.mark.parametrize("task", [LEGO, COMPOSITE], ids=["lego_bidirectional", "composite_causal"])
def test_exact_patching_equals_transformer_lens(task, ours, theirs, direction):
    model, clean, corrupted, metric = counterfactual_setup(task)
    source, target = (clean, corrupted) if direction == "clean_to_corrupted" else (corrupted, clean)
    with torch.no_grad():
        _, source_cache = model.run_with_cache(source.tokens)
        expected = theirs(model, target.tokens, source_cache, lambda logits: metric(logits).mean())
    result = ours(model, clean.tokens, corrupted.tokens, metric, direction=direction, max_batch=24)
    assert result.raw.shape == expected.shape
    assert (result.raw - expected).abs().max() <= 1e-4
    assert expected.std() > 1e-3  # the comparison is not between two constant maps


@pytest.mark.parametrize("kind, theirs", [("attn_out", tl_patching.get_act_patch_attn_out),
                                          ("resid_mid", tl_patching.get_act_patch_resid_mid)])
def test_other_registered_activations_equal_transformer_lens(kind, theirs):
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.tokens)
        expected = theirs(model, corrupted.tokens, clean_cache, lambda logits: metric(logits).mean())
    result = activation_patch(model, clean.tokens, corrupted.tokens, metric, kind, "pos")
    assert (result.raw - expected).abs().max() <= 1e-4


def test_logit_diff_reads_clean_minus_corrupted_label_at_the_label_position():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    logits = model(clean.tokens).detach()
    for i in range(len(clean)):
        pos, good, bad = clean.label_pos[i, 2], clean.labels[i, 2], corrupted.labels[i, 2]
        assert metric(logits)[i].item() == pytest.approx((logits[i, pos, good] - logits[i, pos, bad]).item())


def test_logit_diff_refuses_slots_the_corruption_leaves_unchanged(gen):
    clean = LEGO.sample(8, gen)
    corrupted, _ = LEGO.corrupt(clean, gen, depth=2)
    with pytest.raises(ValueError, match="unchanged"):
        logit_diff_metric(clean, corrupted, label_index=1)
    with pytest.raises(ValueError, match="outside 0..3"):
        logit_diff_metric(clean, corrupted, label_index=4)


@pytest.mark.parametrize("task", [LEGO, COMPOSITE], ids=["lego", "composite"])
def test_normalisation_whole_layer_zero_is_clean_and_untouched_positions_are_corrupted(task):
    model, clean, corrupted, metric = counterfactual_setup(task)
    whole = activation_patch(model, clean.tokens, corrupted.tokens, metric, "resid_pre", over=(), layers=[0])
    assert whole.values.shape == (1,) and whole.values.item() == pytest.approx(1.0, abs=1e-4)
    by_pos = patch_residual(model, clean.tokens, corrupted.tokens, metric, layers=[0]).values[0]
    differs = (clean.tokens != corrupted.tokens).any(0)
    assert by_pos[~differs].abs().max() <= 1e-5  # patching identical activations changes nothing
    # each pair differs at exactly one token, so the positions' effects add up to the whole
    assert by_pos.sum().item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("task", [LEGO, COMPOSITE], ids=["lego", "composite"])
def test_corrupted_to_clean_noising_everything_gives_zero_and_nothing_gives_one(task):
    model, clean, corrupted, metric = counterfactual_setup(task)
    whole = activation_patch(model, clean.tokens, corrupted.tokens, metric, "resid_pre", over=(), layers=[0],
                             direction="corrupted_to_clean")
    assert whole.values.item() == pytest.approx(0.0, abs=1e-4)
    by_pos = patch_residual(model, clean.tokens, corrupted.tokens, metric, layers=[0], direction="corrupted_to_clean")
    differs = (clean.tokens != corrupted.tokens).any(0)
    assert (by_pos.values[0][~differs] - 1).abs().max() <= 1e-5
    assert by_pos.direction == "corrupted_to_clean"


@pytest.mark.parametrize("sweep", [patch_residual, patch_head_out_by_pos, patch_mlp_out])
@pytest.mark.parametrize("task", [LEGO, COMPOSITE], ids=["lego_bidirectional", "composite_causal"])
def test_running_the_last_block_at_the_label_position_only_changes_nothing(task, sweep):
    """A LogitDiff metric reads one position, so the last block's MLP and the unembedding run
    there only; any other callable gets the full forward pass. Both give the same values."""
    model, clean, corrupted, metric = counterfactual_setup(task)
    narrowed = sweep(model, clean.tokens, corrupted.tokens, metric)
    full = sweep(model, clean.tokens, corrupted.tokens, lambda logits: metric(logits))
    assert torch.allclose(narrowed.raw, full.raw, atol=1e-5)


@pytest.mark.parametrize("kind, over", [("head_out", ("pos", "head_index")), ("resid_pre", ("pos",)),
                                        ("mlp_out", ("pos",)), ("resid_post", ("pos",))])
@pytest.mark.parametrize("steps", [1, 3])
def test_attribution_with_the_narrowed_last_block_changes_nothing(kind, over, steps):
    """The same for attribution; activations after the last block's resid_mid (mlp_out,
    resid_post) need every position there, so they keep the full pass."""
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens)
    narrowed = attribution_patch(*args, metric, kind, over, steps=steps)
    full = attribution_patch(*args, lambda logits: metric(logits), kind, over, steps=steps)
    assert torch.allclose(narrowed.raw, full.raw, atol=1e-5)


def test_chunk_size_does_not_change_results():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    one_cell_per_run = patch_head_out_by_pos(model, clean.tokens, corrupted.tokens, metric, max_batch=1)
    all_at_once = patch_head_out_by_pos(model, clean.tokens, corrupted.tokens, metric, max_batch=100_000)
    assert torch.allclose(one_cell_per_run.raw, all_at_once.raw, atol=1e-5)


def count_calls(module, counts, key, backward=False):
    bump = lambda *_: counts.__setitem__(key, counts.get(key, 0) + 1)  # noqa: E731
    return module.register_full_backward_hook(bump) if backward else module.register_forward_hook(bump)


@pytest.mark.parametrize("patch", [patch_residual, patch_head_out_by_pos, patch_mlp_out])
def test_patching_a_later_layer_never_reruns_earlier_blocks(patch):
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    counts = {}
    handles = [count_calls(model.blocks[0], counts, "block0"), count_calls(model.blocks[1], counts, "block1")]
    result = patch(model, clean.tokens, corrupted.tokens, metric, layers=[1], max_batch=40)  # 5 cells per run
    for handle in handles:
        handle.remove()
    assert result.layers == [1] and result.raw.shape[0] == 1
    assert counts["block0"] == 1  # the one cached run of clean and corrupted together
    if patch is patch_residual:  # the cached run, then one run per chunk of 5 positions
        assert counts["block1"] == 1 + math.ceil(clean.tokens.shape[1] / 5)


def test_attribution_shapes_and_labels():
    model, clean, corrupted, metric = counterfactual_setup(COMPOSITE)
    n_pos, n_heads, n_layers = clean.tokens.shape[1], model.cfg.n_heads, model.cfg.n_layers
    args = (model, clean.tokens, corrupted.tokens, metric)
    assert attribute_head_out(*args).values.shape == (n_layers, n_heads)
    by_pos = attribute_head_out_by_pos(*args)
    assert by_pos.values.shape == (n_layers, n_pos, n_heads)
    assert by_pos.axes == ("layer", "pos", "head_index") and by_pos.method == "attribution"
    assert attribute_residual(*args).values.shape == (n_layers, n_pos)
    json.dumps(by_pos.to_dict())


@pytest.mark.parametrize("direction", ["clean_to_corrupted", "corrupted_to_clean"])
def test_attribution_runs_each_input_forward_once_and_only_the_target_backward(direction):
    """One forward pass of each input (what the stacked clean+corrupted run of exact patching
    costs) and one backward pass, over the target's samples only."""
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    forward_batches, backward_batches = [], []
    handles = [
        model.blocks[0].register_forward_hook(lambda module, inputs, out: forward_batches.append(out.shape[0])),
        model.unembed.register_full_backward_hook(
            lambda module, grad_in, grad_out: backward_batches.append(grad_out[0].shape[0])),
    ]
    attribute_head_out_by_pos(model, clean.tokens, corrupted.tokens, metric, direction=direction)
    for handle in handles:
        handle.remove()
    assert sorted(forward_batches) == [len(clean), len(clean)]  # clean once, corrupted once
    assert backward_batches == [len(clean)]


def nudged_metric(model, target, source_cache, metric, layer, head, eps):
    """The target run's mean metric with one head's output moved `eps` of the way to the source's."""
    name = f"blocks.{layer}.attn.hook_z"

    def nudge(z, hook):
        z = z.clone()
        z[:, :, head] += eps * (source_cache[name][:, :, head] - z[:, :, head])
        return z

    with torch.no_grad():
        return metric(model.run_with_hooks(target.tokens, fwd_hooks=[(name, nudge)])).mean().item()


@pytest.mark.parametrize("direction", ["clean_to_corrupted", "corrupted_to_clean"])
def test_attribution_takes_the_gradient_at_the_target_run(direction):
    """clean -> corrupted patches into the corrupted run, so the slope is taken there (and the
    other way round): each cell's estimate equals a finite difference at the target run (on this
    model the slopes at the two runs differ by up to 5e-3 per cell, so the wrong point fails)."""
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    estimate = attribute_head_out(model, clean.tokens, corrupted.tokens, metric, direction=direction)
    source, target = (clean, corrupted) if direction == "clean_to_corrupted" else (corrupted, clean)
    _, source_cache = model.run_with_cache(source.tokens)
    eps, base = 1e-2, nudged_metric(model, target, source_cache, metric, 0, 0, 0.0)
    slopes = torch.tensor([[(nudged_metric(model, target, source_cache, metric, layer, head, eps) - base) / eps
                            for head in range(model.cfg.n_heads)] for layer in range(model.cfg.n_layers)])
    assert (estimate.raw - base - slopes).abs().max() <= 1e-3


def nearly_equal_elements(eps):
    """The LEGO model with the two z2 element tokens ('+', '-') embedded `eps` apart, so every
    activation difference between clean and corrupted is O(eps): the first-order regime."""
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    plus, minus = LEGO.first_element, LEGO.first_element + 1
    with torch.no_grad():
        direction = model.W_E[minus] - model.W_E[plus]
        model.W_E[minus] = model.W_E[plus] + eps * direction
    return model, clean.tokens, corrupted.tokens, metric


@pytest.mark.parametrize("kind, over", [("head_out", ("pos", "head_index")), ("resid_pre", ("pos",))])
def test_attribution_approaches_exact_as_the_difference_shrinks(kind, over):
    relative_errors = []
    for eps in (1.0, 1e-2):
        args = nearly_equal_elements(eps)
        exact = activation_patch(*args, kind, over)
        estimate = attribution_patch(*args, kind, over)
        # compare effects in metric units: normalising divides by the mean effect over pairs,
        # which cancels to ~0 on a random model and would amplify float noise
        effect = exact.raw - exact.corrupted_metric
        relative_errors.append(((estimate.raw - exact.raw).abs().max() / effect.abs().max()).item())
    assert relative_errors[1] < 0.02 and relative_errors[1] < relative_errors[0] / 5


@pytest.mark.parametrize("direction", ["clean_to_corrupted", "corrupted_to_clean"])
def test_integrated_gradients_are_complete_at_the_embeddings(direction):
    """Integrated gradients along the embedding line: the estimates of patching each position of
    the embeddings (resid_pre of block 0) add up to the whole change, source metric minus target
    metric (completeness); one-step attribution does not, and more steps get closer."""
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric, "resid_pre", ("pos",))
    errors = {}
    for steps in (1, 4, 32):
        result = attribution_patch(*args, direction=direction, layers=[0], steps=steps)
        target, source = ((result.corrupted_metric, result.clean_metric) if direction == "clean_to_corrupted"
                          else (result.clean_metric, result.corrupted_metric))
        errors[steps] = abs((result.raw - target).sum().item() - (source - target)) / abs(source - target)
    assert errors[32] < 0.01 and errors[32] < errors[4] < errors[1]


def test_integrated_gradients_do_not_depend_on_the_pass_size():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric)
    one_pass = attribute_head_out_by_pos(*args, steps=6)
    estimate = attribution_patch(*args, "head_out", ("pos", "head_index"), steps=6, max_batch=len(clean) * 4)
    assert torch.allclose(estimate.raw, one_pass.raw, atol=1e-5)
    assert not torch.allclose(one_pass.raw, attribute_head_out_by_pos(*args).raw, atol=1e-5)  # it is not AtP
    with pytest.raises(ValueError, match="steps=0"):
        attribute_head_out(*args, steps=0)


def test_attribution_works_with_frozen_parameters():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    expected = attribute_head_out(model, clean.tokens, corrupted.tokens, metric).values
    model.requires_grad_(False)
    assert torch.allclose(attribute_head_out(model, clean.tokens, corrupted.tokens, metric).values, expected)


def test_cell_masks_cover_one_head_at_one_position():
    masks = cell_masks(("pos", "head_index"), ("pos", "head_index"), {"pos": 3, "head_index": 2})
    assert masks.shape == (6, 3, 2) and (masks.sum((1, 2)) == 1).all()
    assert masks[2 * 1 + 0, 1, 0]  # row-major: cell (pos 1, head 0)
    per_head = cell_masks(("pos", "head_index"), ("head_index",), {"pos": 3, "head_index": 2})
    assert per_head.shape == (2, 3, 2) and per_head[1, :, 1].all() and not per_head[1, :, 0].any()


def test_bad_inputs_get_errors_that_name_the_value():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric)
    # with the jaxtyping import hook active, the shape check fires first (a TypeError)
    with pytest.raises((ValueError, TypeError), match="corrupted_tokens"):
        patch_residual(model, clean.tokens, corrupted.tokens[:, :-1], metric)
    with pytest.raises(ValueError, match=r"'z' is unknown; use one of \['attn_out'"):
        activation_patch(*args, "z")
    with pytest.raises(ValueError, match="direction='sideways' is unknown"):
        patch_residual(*args, direction="sideways")
    with pytest.raises(ValueError, match="among"):
        activation_patch(*args, "resid_pre", over=("head_index",))
    with pytest.raises(ValueError, match=r"layers=\[2\]"):
        patch_residual(*args, layers=[2])
    with pytest.raises(ValueError, match="max_batch=0"):
        patch_residual(*args, max_batch=0)
    with pytest.raises(ValueError, match="one value per pair"):
        patch_residual(model, clean.tokens, corrupted.tokens, lambda logits: metric(logits).mean())


def test_spearman_uses_tie_averaged_ranks_and_refuses_different_cells():
    a = torch.tensor([1.0, 2.0, 2.0, 3.0])
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # the Pearson correlation of the ranks [1, 2.5, 2.5, 4] and [1, 3, 2, 4]
    assert spearman(a, torch.tensor([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.9486833, abs=1e-6)
    with pytest.raises(ValueError, match="same cells"):
        spearman(a, a[:3])
    assert math.isnan(spearman(a, torch.zeros(4)))  # a constant map has no ranking
    assert math.isnan(spearman(torch.tensor([1.0, float("nan"), float("nan"), 4.0]), a))


@pytest.fixture(scope="module")
def benchmark():
    """`workbench benchmark --patching` on a tiny random composite model: its model and results."""
    model = build_model(TINY_MODEL, COMPOSITE)
    return model, run_patching_benchmark(model, COMPOSITE, n_pairs=4, repeats=1, ig_steps=[2])


def test_benchmark_runs_and_agrees_with_transformer_lens(benchmark):
    _, results = benchmark
    assert results["max_abs_diff_vs_transformer_lens"] <= 1e-4
    assert results["n_cells"] == 2 * COMPOSITE.n_ctx * 2
    assert -1 <= results["spearman_head_out_by_pos"] <= 1
    assert results["ig2_speedup_vs_exact"] > 0 and -1 <= results["ig2_spearman_head_out"] <= 1
    # AtP*'s yardstick beside each correlation: a share of the cells, at least the top 3's own
    assert 3 / results["n_cells"] <= results["verified_head_out_by_pos"] <= 1
    assert 0 < results["ig2_verified_head_out"] <= 1


def test_benchmark_judges_four_estimates_side_by_side_by_the_verified_fraction(benchmark, capsys):
    model, results = benchmark
    estimates = {"head_out_by_pos": ["atp", "graddrop", "ig2"], "head_out": ["atp", "graddrop", "ig2"],
                 "q_by_pos": ["atp", "qk-fix", "qk-fix+graddrop", "graddrop", "ig2"],  # the QK fix: queries and keys
                 "q": ["atp", "qk-fix", "qk-fix+graddrop", "graddrop", "ig2"]}
    for cells, names in estimates.items():
        for name in names:
            assert 0 < results[f"yardstick.{cells}.{name}.verified"] <= 1
            assert -1 <= results[f"yardstick.{cells}.{name}.spearman"] <= 1
            assert results[f"yardstick.{cells}.{name}.time_s"] > 0
    # the fraction is AtP*'s verification cost, recomputed here for GradDrop on head x position cells
    clean, corrupted = unaligned_pairs(COMPOSITE, 4, 0)
    args = (model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, 0))
    exact = patch_head_out_by_pos(*args)
    graddrop = attribution_patch(*args, "head_out", ("pos", "head_index"), grad_drop=True)
    assert results["yardstick.head_out_by_pos.graddrop.verified"] == verification_cost(graddrop, exact,
                                                                                       3) / exact.values.numel()
    print_report(results)
    table = capsys.readouterr().out.split("AtP*'s yardstick")[1].splitlines()
    assert [line.split()[:3] for line in table[2:5]] == [["head", "x", "pos"]] * 3  # exact, then each estimate
    assert table[3].split()[4:6] == ["atp", f"{results['yardstick.head_out_by_pos.atp.verified']:.3f}"]


def test_exact_patching_of_a_model_with_planted_heads_matches_transformer_lens(gen):
    """Planted heads build their pattern from token ids; runs that start from a residual stream
    must use the target's ids, not those of the stacked clean+corrupted run."""
    from transformer_lens.patching import get_act_patch_attn_head_out_by_pos

    from interp.patching import logit_diff_metric, patch_head_out_by_pos
    from models.config import ModelConfig
    from models.factory import build_model
    from tasks import LegoConfig, LegoTask

    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
    planted = {"1.0": "association", "2.0": "association"}
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, planted=planted), task, seed=1)
    clean = task.sample(8, gen, split="test", aligned=True)
    corrupted, _ = task.corrupt(clean, gen, depth=0)
    metric = logit_diff_metric(clean, corrupted, label_index=2)
    ours = patch_head_out_by_pos(model, clean.tokens, corrupted.tokens, metric)
    _, clean_cache = model.run_with_cache(clean.tokens)
    theirs = get_act_patch_attn_head_out_by_pos(model, corrupted.tokens, clean_cache,
                                                lambda logits: metric(logits).mean())
    assert (ours.raw - theirs).abs().max() <= 1e-4


def test_blend_curve_runs_from_corrupted_to_exact_patching():
    from analyses.bench.patching import blend_curve

    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    exact = patch_head_out(model, clean.tokens, corrupted.tokens, metric)
    curve = blend_curve(model, clean.tokens, corrupted.tokens, metric, layer=1, head=0, alphas=(0.0, 0.5, 1.0))
    assert curve[0] == pytest.approx(exact.corrupted_metric, abs=1e-5)
    assert curve[2] == pytest.approx(exact.raw[1, 0].item(), abs=1e-4)
    # holding the downstream MLP outputs at their corrupted values takes their share of the effect away
    frozen = blend_curve(model, clean.tokens, corrupted.tokens, metric, layer=1, head=0, alphas=(1.0,), freeze=("mlp",))
    assert frozen[0] != pytest.approx(curve[2], abs=1e-6)


def test_agreement_by_slot_covers_every_slot_the_corruption_changes(gen):
    from analyses.bench.patching import agreement_by_slot

    model, clean, _, _ = counterfactual_setup(LEGO)
    corrupted, _ = LEGO.corrupt(clean, gen, depth=1)  # variables #1.. change, #0 does not
    results = agreement_by_slot(model, clean, corrupted)
    slots = sorted({key.split("_")[0] for key in results})
    assert slots == [f"slot{i}" for i in range(1, LEGO.cfg.n_vars)]
    assert all(-1 <= results[f"{slot}_spearman_head_out"] <= 1 for slot in slots)


def test_planted_heads_read_the_token_ids_of_each_forward_or_fail_loudly(gen):
    """No hidden state survives a forward: a start_at_layer pass gets its ids from `tokens=` or a
    token_context, and without either it raises instead of reusing the last batch's ids."""
    from models.config import ModelConfig
    from models.planted import token_context

    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, planted={"1.0": "association"}), task, seed=1)
    first, second = task.sample(4, gen, split="test"), task.sample(4, gen, split="test")
    _, cache = model.run_with_cache(second.tokens)
    resid = cache["blocks.1.hook_resid_pre"]
    whole = model(second.tokens)
    model(first.tokens)  # the last forward saw other ids
    with pytest.raises(RuntimeError, match="has no token ids"):
        model(resid, start_at_layer=1)
    torch.testing.assert_close(model(resid, start_at_layer=1, tokens=second.tokens), whole)
    with token_context(model, second.tokens):
        torch.testing.assert_close(model(resid.repeat(2, 1, 1), start_at_layer=1), whole.repeat(2, 1, 1))
        model(first.tokens)  # a forward from token ids inside the context uses its own ids ...
        torch.testing.assert_close(model(resid, start_at_layer=1), whole)  # ... and leaves the context alone
    with pytest.raises(RuntimeError, match="has no token ids"):
        model(resid, start_at_layer=1)
    # the stale ids would have given another answer: the failure guards a real difference
    wrong = model(resid, start_at_layer=1, tokens=first.tokens)
    assert not torch.allclose(wrong, whole)


@pytest.mark.parametrize("positional", ["standard", "rotary"])
def test_the_last_blocks_attention_runs_on_the_label_query_only_and_changes_no_number(positional):
    """Exact patching narrows the last block to the label position, its attention included (the
    queries after rotary where the model has it); TransformerLens runs it in full."""
    from dataclasses import replace

    from interp.patching.exact import _narrowed_last_block

    model = build_model(replace(TINY_MODEL, positional=positional), LEGO, seed=4)
    gen = seeded_generator(4)
    clean = LEGO.sample(8, gen, split="test")
    corrupted, _ = LEGO.corrupt(clean, gen, depth=1)
    metric = logit_diff_metric(clean, corrupted, 2)
    hooks, _ = _narrowed_last_block(model, metric)
    last = model.cfg.n_layers - 1
    assert [name for name, _ in hooks] == [f"blocks.{last}.attn.{'hook_rot_q' if positional == 'rotary' else 'hook_q'}",
                                           f"blocks.{last}.hook_resid_mid"]
    with torch.no_grad():
        _, source_cache = model.run_with_cache(clean.tokens)
        for ours, theirs in SWEEPS[:2]:
            expected = theirs(model, corrupted.tokens, source_cache, lambda logits: metric(logits).mean())
            assert (ours(model, clean.tokens, corrupted.tokens, metric).raw - expected).abs().max() <= 1e-4
