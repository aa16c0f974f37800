"""AtP*'s pieces (Kramar et al. 2024): queries and keys as patchable cells, the QK fix, GradDrop,
screening with exact verification, and the verification-cost yardstick."""

import warnings

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.patching import (
    LogitDiff,
    PatchResult,
    activation_patch,
    attribution_patch,
    screen_and_verify,
    verification_cost,
)
from tests.unit.test_patching import LEGO, counterfactual_setup

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformer_lens import patching as tl_patching


@pytest.mark.parametrize("kind, theirs", [("q", tl_patching.get_act_patch_attn_head_q_by_pos),
                                          ("k", tl_patching.get_act_patch_attn_head_k_by_pos)])
def test_exact_patching_of_queries_and_keys_equals_transformer_lens(kind, theirs):
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.tokens)
        expected = theirs(model, corrupted.tokens, clean_cache, lambda logits: metric(logits).mean())
    result = activation_patch(model, clean.tokens, corrupted.tokens, metric, kind, ("pos", "head_index"), max_batch=24)
    assert (result.raw - expected).abs().max() <= 1e-4
    assert expected.std() > 1e-3


def linear_in_the_pattern(positional: str) -> tuple[HookedTransformer, torch.Tensor, torch.Tensor, LogitDiff]:
    """One attention-only layer and no norms: the logits are linear in the attention pattern,
    so an estimate that computes the pattern exactly and linearises only after it is exact.
    Large query weights saturate the softmax, where plain attribution is far off."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=8, d_vocab=12, attn_only=True,
                                  normalization_type=None, attention_dir="bidirectional",
                                  positional_embedding_type=positional,
                                  rotary_dim=2 if positional == "rotary" else None, seed=0)
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.mul_(40.0)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(12, (6, 8), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1 + torch.randint(11, (6,), generator=gen)) % 12
    metric = LogitDiff(torch.full((6,), 2), torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long))
    return model, clean, corrupted, metric


@pytest.mark.parametrize("positional", ["standard", "rotary"])
@pytest.mark.parametrize("kind", ["q", "k"])
def test_the_qk_fix_is_exact_where_the_metric_is_linear_in_the_pattern(kind, positional):
    model, clean, corrupted, metric = linear_in_the_pattern(positional)
    args = (model, clean, corrupted, metric, kind, ("pos", "head_index"))
    exact = activation_patch(*args)
    fixed, plain = attribution_patch(*args, qk_fix=True), attribution_patch(*args)
    assert (fixed.raw - exact.raw).abs().max() <= 1e-4
    assert (plain.raw - exact.raw).abs().max() > 1e-2  # the softmax is far from linear here
    assert fixed.method == "attribution+qk-fix"


def test_the_qk_fix_refuses_activations_other_than_queries_and_keys():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    with pytest.raises(ValueError, match="qk_fix applies to the kinds"):
        attribution_patch(model, clean.tokens, corrupted.tokens, metric, "head_out", ("head_index",), qk_fix=True)
    with pytest.raises(ValueError, match="one-step"):
        attribution_patch(model, clean.tokens, corrupted.tokens, metric, "q", ("head_index",), steps=2, qk_fix=True)


def test_grad_drop_averages_passes_that_each_cut_one_layer_from_the_gradient():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric, "head_out", ("pos", "head_index"))
    plain, dropped = attribution_patch(*args), attribution_patch(*args, grad_drop=True)
    last = model.cfg.n_layers - 1
    # the last layer: cutting an earlier layer leaves its gradient alone, so every pass is plain
    assert torch.allclose(dropped.raw[last], plain.raw[last], atol=1e-6)
    # layer 0: the mean |estimate| over the passes that cut layer 1, 2, ... from the gradient
    target = dropped.corrupted_metric
    passes = []
    for cut in range(1, model.cfg.n_layers):
        hooks = [(f"blocks.{cut}.hook_{part}_out", lambda act, hook: act.detach()) for part in ("attn", "mlp")]
        with model.hooks(fwd_hooks=hooks):
            passes.append(attribution_patch(*args, layers=[0]).raw[0] - target)
    expected = torch.stack(passes).abs().mean(0)
    assert torch.allclose((dropped.raw[0] - target).abs(), expected, atol=1e-6)
    assert not torch.allclose(dropped.raw[0], plain.raw[0], atol=1e-4)  # the cut passes do differ


def test_screen_and_verify_patches_the_estimates_top_cells_exactly():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric, "head_out", ("pos", "head_index"))
    exact, estimate = activation_patch(*args), attribution_patch(*args)
    screened = screen_and_verify(*args, budget=7)
    assert len(screened.cells) == 7
    sizes = (estimate.raw - estimate.corrupted_metric).abs()
    assert sizes[screened.cells[-1]] >= sizes.flatten().sort(descending=True).values[6] - 1e-9
    for cell, value in zip(screened.cells, screened.values):
        assert value.item() == pytest.approx(exact.values[cell].item(), abs=1e-4)
    with pytest.raises(ValueError, match="budget"):
        screen_and_verify(*args, budget=0)


def result_of(raw: list[float]) -> PatchResult:
    values = torch.tensor([raw])
    return PatchResult(values, values, ("layer", "head_index"), [0], "head_out", "h", "clean_to_corrupted", "x", 1.0,
                       0.0)


def test_verification_cost_counts_cells_until_exacts_top_k_are_verified():
    exact = result_of([0.9, 0.0, -0.8, 0.1, 0.05])  # top 2 by |effect|: cells 0 and 2
    assert verification_cost(result_of([0.5, 0.4, 0.3, 0.0, 0.0]), exact, k=2) == 3
    assert verification_cost(result_of([0.7, 0.0, -0.9, 0.0, 0.1]), exact, k=2) == 2
    assert verification_cost(result_of([0.0, 0.9, 0.0, 0.8, 0.7]), exact, k=1) == 4
    with pytest.raises(ValueError, match="k=6"):
        verification_cost(exact, exact, k=6)
    with pytest.raises(ValueError, match="non-finite"):
        verification_cost(result_of([float("nan"), 0, 0, 0, 0]), exact)


@pytest.mark.parametrize("kind", ["q", "k"])
def test_planted_heads_queries_and_keys_matter_to_neither_exact_patching_nor_the_qk_fix(kind, gen):
    from dataclasses import replace

    from interp.patching import logit_diff_metric
    from models.factory import build_model
    from tests.helpers import TINY_MODEL

    model = build_model(replace(TINY_MODEL, planted={"1.0": "association"}), LEGO, seed=0)
    clean = LEGO.sample(8, gen, split="test")
    corrupted, _ = LEGO.corrupt(clean, gen, depth=1)
    args = (model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, 2), kind, ("pos", "head_index"))
    exact, fixed = activation_patch(*args), attribution_patch(*args, qk_fix=True)
    assert exact.raw[1, :, 0].sub(exact.corrupted_metric).abs().max() < 1e-6
    assert fixed.raw[1, :, 0].sub(fixed.corrupted_metric).abs().max() == 0.0
    assert fixed.raw[1, :, 1].sub(fixed.corrupted_metric).abs().max() > 0.0  # the learned head of that layer


def test_verification_cost_looks_only_for_cells_that_do_something():
    exact = result_of([0.0, 0.9, 0.0, 0.0, 0.0])  # one cell matters; "top 3" would add two arbitrary zeros
    assert verification_cost(result_of([0.5, 0.4, 0.3, 0.2, 0.1]), exact, k=3) == 2
    with pytest.raises(ValueError, match="nothing to find"):
        verification_cost(exact, result_of([0.0] * 5))
