"""The gradient variants of analyses.research.attribution_variants: they change what the backward pass
sees, never the forward values, and the secant rule sees a neuron switched on."""

import pytest
import torch

from analyses.research.attribution_variants import VARIANTS, _secant_slope, frozen_norms, secant_gelu, variant_agreement
from interp.patching import attribute_head_out
from models.factory import build_model
from tasks import LegoConfig, LegoTask
from tests.helpers import TINY_MODEL
from tests.unit.test_patching import LEGO, counterfactual_setup


def test_secant_slope_is_the_chord_and_the_derivative_where_the_ends_meet():
    gelu = torch.nn.functional.gelu
    a, b = torch.tensor([-3.0, 0.5]), torch.tensor([3.0, 0.5])
    slope = _secant_slope(gelu, a, b)
    assert slope[0].item() == pytest.approx(((gelu(b[0]) - gelu(a[0])) / 6).item())
    x = torch.tensor(0.5, requires_grad=True)
    assert slope[1].item() == pytest.approx(torch.autograd.grad(gelu(x), x)[0].item())


@pytest.mark.parametrize("context", [frozen_norms, secant_gelu])
def test_variants_keep_forward_values_and_change_the_estimate(context):
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    args = (model, clean.tokens, corrupted.tokens, metric)
    plain, logits = attribute_head_out(*args), model(corrupted.tokens)
    with context(model):
        varied = attribute_head_out(*args)
        with torch.no_grad():
            model(clean.tokens)  # a full-width source pass, then a target pass with autograd on
        assert torch.equal(model(corrupted.tokens), logits)
    assert varied.corrupted_metric == plain.corrupted_metric and varied.clean_metric == plain.clean_metric
    assert not torch.allclose(varied.values, plain.values)
    assert not model.hook_dict["blocks.0.mlp.hook_post"].fwd_hooks  # the context removed its hooks


def test_secant_slopes_span_the_clean_source_and_the_corrupted_target():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    _, clean_cache = model.run_with_cache(clean.tokens)
    _, corrupted_cache = model.run_with_cache(corrupted.tokens)
    with secant_gelu(model) as recorded:
        attribute_head_out(model, clean.tokens, corrupted.tokens, metric)
    # layer 0 runs at full width; the last block's MLP only at the label rows, in both passes alike
    assert torch.allclose(recorded["source"][0], clean_cache["blocks.0.mlp.hook_pre"])
    assert torch.allclose(recorded["target"][0], corrupted_cache["blocks.0.mlp.hook_pre"])
    assert recorded["source"][1].shape == recorded["target"][1].shape


def test_secant_refuses_a_target_without_a_matching_source_pass():
    model, clean, corrupted, metric = counterfactual_setup(LEGO)
    with secant_gelu(model), pytest.raises(ValueError, match="no source pass"):
        model(corrupted.tokens)  # autograd on, and no source recorded
    with secant_gelu(model), pytest.raises(ValueError, match="no source pass"):
        attribute_head_out(model, clean.tokens, corrupted.tokens, metric)  # the last block's source is narrowed
        model(corrupted.tokens)  # ... so a full-width pass has no partner there


def test_variant_agreement_reports_every_variant_as_a_correlation():
    task = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
    model = build_model(TINY_MODEL, task, seed=0)
    agreement = variant_agreement(model, task, slot=1, n_pairs=8)
    assert set(agreement) == set(VARIANTS)
    assert all(-1 <= value <= 1 for pair in agreement.values() for value in pair)
    assert agreement["atp"][1] > 0.5  # a random model is nearly linear: one step already agrees per head
