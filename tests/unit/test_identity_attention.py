import pytest
import torch

from interp.attention import classify_heads
from models.config import ModelConfig
from models.factory import build_model, layers_are_tied
from tasks import CompositeConfig, CompositeTask, ConfigError, LegoConfig, LegoTask, seeded_generator

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


def test_the_terms_are_a_h_x_xt_on_the_scores_and_b_h_a_h_x_on_the_output(gen):
    """Against the formula: with a_h, b_h set, each head's scores differ from the plain model's
    by a_h X X^T / sqrt(d_model) (X = the attention input, ln1's output) and the attention
    output by sum_h b_h A_h X, with A_h the head's (augmented) pattern."""
    task = CompositeTask(CompositeConfig())
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2)
    plain = build_model(cfg, task, seed=5)
    augmented = build_model(ModelConfig(**{**cfg.__dict__, "identity_attention": True}), task, seed=5)
    a, b = torch.tensor([0.7, -1.3]), torch.tensor([0.4, 2.0])
    with torch.no_grad():
        augmented.blocks[0].attn.identity_a.copy_(a)
        augmented.blocks[0].attn.identity_b.copy_(b)
    tokens = task.sample(3, gen).tokens
    _, base = plain.run_with_cache(tokens)
    _, aug = augmented.run_with_cache(tokens)
    x = base["blocks.0.ln1.hook_normalized"]
    similarity = torch.einsum("bqd,bkd->bqk", x, x) / 32**0.5
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
    expected = base["blocks.0.attn.hook_attn_scores"] + a[None, :, None, None] * similarity[:, None]
    got = aug["blocks.0.attn.hook_attn_scores"]
    assert torch.allclose(got[..., causal], expected[..., causal], atol=1e-5)
    pattern = aug["blocks.0.attn.hook_pattern"]
    copied = torch.einsum("bhqk,bkd,h->bqd", pattern, x, b)
    w_o_part = torch.einsum("bqhe,hed->bqd", aug["blocks.0.attn.hook_z"], augmented.blocks[0].attn.W_O)
    w_o_part = w_o_part + augmented.blocks[0].attn.b_O
    assert torch.allclose(aug["blocks.0.hook_attn_out"], w_o_part + copied, atol=1e-5)


def test_off_diagonal_identity_attention_sends_a_symbol_to_its_other_occurrence():
    """With the position's own score left out, a large a_h makes a right-hand variable attend to
    its parent clause's left-hand token (the other occurrence of its letter), not to itself."""
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=1, identity_attention=True, identity_off_diagonal=True,
                      positional="rotary")
    model = build_model(cfg, LEGO)
    with torch.no_grad():
        model.blocks[0].attn.identity_a[0] = 40.0
    batch = LEGO.sample(64, seeded_generator(0), split="test")
    _, cache = model.run_with_cache(batch.tokens)
    rows = torch.arange(len(batch))
    rhs_of_1, lhs_of_0 = batch.label_pos[:, 1] + 3, batch.label_pos[:, 0]
    pattern = cache["blocks.0.attn.hook_pattern"][:, 0]
    assert (pattern[rows, rhs_of_1, lhs_of_0] > 0.9).all()
    assert (pattern[rows, rhs_of_1, rhs_of_1] < 0.01).all()


def test_off_diagonal_needs_identity_attention():
    with pytest.raises(ConfigError, match="identity_off_diagonal"):
        ModelConfig(identity_off_diagonal=True)
