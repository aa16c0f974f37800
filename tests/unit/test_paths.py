"""Path patching against the textbook recipe, and on planted heads whose Q/K paths are known."""

import pytest
import torch

from interp.patching import logit_diff_metric, patch_head_out
from interp.paths import INPUTS, path_patch, path_patch_reference
from models.config import ModelConfig
from models.factory import build_model
from tasks import CompositeConfig, CompositeTask, LegoConfig, LegoTask, seeded_generator

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
COMPOSITE = CompositeTask(CompositeConfig())


def pairs(task, n=6, seed=0):
    clean, corrupted, _ = task.counterfactual_pairs(n, seeded_generator(seed))
    slot = 1 if task is LEGO else 0
    return clean, corrupted, logit_diff_metric(clean, corrupted, label_index=slot)


@pytest.mark.parametrize("task, model_cfg, direction", [
    (LEGO, ModelConfig(n_layers=3, d_model=32, n_heads=2, positional="rotary"), "clean_to_corrupted"),
    (COMPOSITE, ModelConfig(n_layers=3, d_model=32, n_heads=2, init_gamma=0.3), "corrupted_to_clean"),
    (LEGO, ModelConfig(n_layers=3, d_model=32, n_heads=2, planted={"1.0": "association"}), "clean_to_corrupted"),
])
def test_path_patching_equals_the_slow_reference(task, model_cfg, direction):
    model = build_model(model_cfg, task, seed=2)
    clean, corrupted, metric = pairs(task)
    result = path_patch(model, clean.tokens, corrupted.tokens, metric, direction=direction, max_batch=16)
    diffs = []
    for ls in range(3):
        for hs in range(2):
            ref = path_patch_reference(model, clean.tokens, corrupted.tokens, metric, (ls, hs), None, direction)
            diffs.append(abs(result.direct_raw[ls, hs].item() - ref))
            for lr in range(ls + 1, 3):
                for hr in range(2):
                    for i, name in enumerate(INPUTS):
                        ref = path_patch_reference(model, clean.tokens, corrupted.tokens, metric, (ls, hs), (lr, hr, name),
                                                   direction)
                        diffs.append(abs(result.edges_raw[ls, hs, lr, hr, i].item() - ref))
    assert max(diffs) <= 1e-4
    assert torch.isnan(result.edges[2, :, 0]).all() and torch.isnan(result.edges[1, :, 1]).all()  # no backward paths
    assert result.edges[0, :, 1:].isfinite().all()
    assert result.edges_raw[0, :, 1:].std() > 1e-4  # edges differ: the comparison is not between constants


def test_planted_heads_have_no_query_or_key_paths_and_zeroed_outputs_no_edges():
    """Known by construction: a planted head's pattern ignores its queries and keys, so every
    Q and K edge into it is exactly 0 (normalised) while its V edges are not; a head whose
    W_O is zero sends nothing."""
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, planted={"1.0": "association", "2.1": "manipulation"}),
                        LEGO, seed=4)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1].zero_()
    clean, corrupted, metric = pairs(LEGO, n=8, seed=1)
    result = path_patch(model, clean.tokens, corrupted.tokens, metric)
    for layer, head in [(1, 0), (2, 1)]:
        into = result.edges[:layer, :, layer, head]  # [sender layer, sender head, input]
        assert into[..., :2].abs().max() <= 1e-6  # q and k
        assert into[..., 2].abs().max() > 1e-3  # v
    assert result.edges[0, 1, 1:].abs().max() <= 1e-6
    assert abs(result.direct[0, 1]) <= 1e-6
    learned = result.edges[:1, :1, 1, 1, :2]  # a learned receiver's q/k paths are not zero
    assert learned.abs().max() > 1e-4


def test_a_heads_direct_effect_is_its_exact_patch_when_nothing_reads_it():
    """In the last layer a head's output reaches the logits only directly: its direct path
    effect equals exact patching of its output."""
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=2), COMPOSITE, seed=5)
    clean, corrupted, metric = pairs(COMPOSITE, n=8)
    with torch.no_grad():  # the last layer's MLP reads the head's output too: take it out of the comparison
        for p in model.blocks[1].mlp.parameters():
            p.zero_()
    paths = path_patch(model, clean.tokens, corrupted.tokens, metric)
    exact = patch_head_out(model, clean.tokens, corrupted.tokens, metric)
    torch.testing.assert_close(paths.direct[1], exact.values[1], atol=1e-4, rtol=0)


def test_post_ln_and_identity_attention_models_are_refused():
    clean, corrupted, metric = pairs(LEGO)
    for cfg in (ModelConfig(n_layers=2, d_model=32, n_heads=2, norm_position="post"),
                ModelConfig(n_layers=2, d_model=32, n_heads=2, identity_attention=True)):
        with pytest.raises(ValueError, match="post-LN|identity"):
            path_patch(build_model(cfg, LEGO), clean.tokens, corrupted.tokens, metric)
