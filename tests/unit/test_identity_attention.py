import torch

from interp.attention import classify_heads
from models.config import ModelConfig
from models.factory import build_model, layers_are_tied
from tasks import CompositeConfig, CompositeTask, LegoConfig, LegoTask, seeded_generator

LEGO = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
SMALL = {"n_layers": 2, "d_model": 32, "n_heads": 2}


def test_zero_scalars_give_exactly_the_plain_model(gen):
    for task in (LEGO, CompositeTask(CompositeConfig())):
        tokens = task.sample(4, gen).tokens
        plain = build_model(ModelConfig(**SMALL), task, seed=3)
        augmented = build_model(ModelConfig(**SMALL, identity_attention=True), task, seed=3)
        assert torch.equal(plain(tokens), augmented(tokens))


def test_gradients_reach_both_scalars_and_hook_names_stay(gen):
    model = build_model(ModelConfig(**SMALL, identity_attention=True), LEGO)
    logits, cache = model.run_with_cache(LEGO.sample(4, gen).tokens)
    assert "blocks.1.attn.hook_pattern" in cache and "blocks.0.attn.hook_z" in cache
    logits.sum().backward()
    for block in model.blocks:
        assert block.attn.identity_a.grad.abs().sum() > 0 and block.attn.identity_b.grad.abs().sum() > 0


def test_tied_layers_share_the_scalars():
    model = build_model(ModelConfig(**SMALL, identity_attention=True, tie_layers=True), LEGO)
    assert layers_are_tied(model) and model.blocks[1].attn.identity_a is model.blocks[0].attn.identity_a


def test_a_large_a_h_makes_a_head_attend_to_the_same_symbol():
    """The X X^T term is what makes association cheap: with a_h large, head 0 becomes an
    association head by the classifier's own measure, head 1 (a_h = 0) does not. With rotary
    positions, equal tokens have equal X in layer 0 (with learned absolute positions X X^T
    peaks on the query itself, and the head becomes a self head)."""
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=2, identity_attention=True, positional="rotary")
    model = build_model(cfg, LEGO)
    with torch.no_grad():
        model.blocks[0].attn.identity_a[0] = 40.0
    tokens = LEGO.sample(128, seeded_generator(0), split="test").tokens
    scores = classify_heads(model, LEGO, tokens).score("association")
    assert scores[0, 0] > 0.3 and scores[0, 1] < 0.1
    assert classify_heads(model, LEGO, tokens).labels[0][0] == "association"
