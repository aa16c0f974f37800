import pytest
import torch

from models.config import ModelConfig
from models.factory import build_model, fan_in, forward, layers_are_tied, unique_parameters
from tasks import CompositeConfig, CompositeTask, ConfigError, LegoConfig, LegoTask, logits_at_labels

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
COMPOSITE = CompositeTask(CompositeConfig())


def test_tied_layers_share_one_parameter_set_but_keep_per_layer_hooks(gen):
    tied = build_model(ModelConfig(n_layers=4, d_model=32, n_heads=2, tie_layers=True), LEGO)
    untied = build_model(ModelConfig(n_layers=4, d_model=32, n_heads=2), LEGO)
    assert layers_are_tied(tied) and not layers_are_tied(untied)
    block_params = sum(p.numel() for p in tied.blocks[0].parameters())
    total = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert total(untied) - total(tied) == 3 * block_params
    _, cache = tied.run_with_cache(LEGO.sample(2, gen).tokens)
    patterns = [cache[f"blocks.{i}.attn.hook_pattern"] for i in range(4)]
    assert not torch.allclose(patterns[0], patterns[3])  # same weights, different inputs per layer


def test_tied_gradient_collects_every_layers_contribution(gen):
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, tie_layers=True), LEGO)
    model(LEGO.sample(4, gen).tokens).sum().backward()
    assert model.blocks[2].attn.W_Q.grad is model.blocks[0].attn.W_Q.grad
    assert model.blocks[0].attn.W_Q.grad.abs().sum() > 0


@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.8])
def test_init_scale_gives_std_d_in_to_the_minus_gamma(gamma):
    model = build_model(ModelConfig(n_layers=2, d_model=256, n_heads=4, init_gamma=gamma), LEGO)
    checked = 0
    for name, param in unique_parameters(model).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_") and param.numel() >= 4096:
            expected = fan_in(name, param) ** -gamma
            assert abs(param.std().item() / expected - 1) < 0.05, name
            checked += 1
        elif leaf.startswith("b_"):
            assert (param == 0).all()
    assert checked >= 10


def test_default_init_is_untouched_when_gamma_is_none():
    """Without init_gamma the weights are TransformerLens's own init for that seed, bit for bit."""
    import warnings

    from transformer_lens import HookedTransformer

    a = build_model(ModelConfig(n_layers=1, d_model=64, n_heads=2), LEGO, seed=3)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.manual_seed(3)
        reference = HookedTransformer(a.cfg)
    ours, theirs = dict(a.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    b = build_model(ModelConfig(n_layers=1, d_model=64, n_heads=2, init_gamma=0.5), LEGO, seed=3)
    assert not torch.allclose(a.blocks[0].attn.W_Q, b.blocks[0].attn.W_Q)


def test_encoder_sees_the_future_decoder_does_not(gen):
    for task, sees_future in [(LEGO, True), (COMPOSITE, False)]:
        model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2), task)
        tokens = task.sample(1, gen).tokens
        changed = tokens.clone()
        changed[0, -1] = (tokens[0, -1] + 1) % task.d_vocab
        assert (not torch.allclose(model(tokens)[0, 0], model(changed)[0, 0])) == sees_future


def test_output_heads_match_the_tasks():
    assert build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2), LEGO).cfg.d_vocab_out == 2
    assert build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2), COMPOSITE).cfg.attention_dir == "causal"


def test_depth_limited_forward_skips_the_top_blocks(gen):
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2), LEGO)
    tokens = LEGO.sample(2, gen).tokens
    shallow = forward(model, tokens, depth=1)
    original = model.blocks[1].forward
    model.blocks[1].forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("block 1 ran"))
    assert torch.allclose(forward(model, tokens, depth=1), shallow)
    model.blocks[1].forward = original
    assert torch.allclose(forward(model, tokens, depth=3), model(tokens))


def test_same_seed_same_weights_without_touching_global_rng():
    state = torch.get_rng_state()
    a = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2), LEGO, seed=5)
    b = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2), LEGO, seed=5)
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_sequence_longer_than_n_ctx_is_a_config_error():
    with pytest.raises(ConfigError, match="model.n_ctx=10"):
        build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, n_ctx=10), LEGO)


def test_shapes_are_checked_at_runtime_in_tests():
    """Label positions of another batch size: torch's gather accepts them (its index may be
    smaller than the input), the jaxtyping annotation ("batch" shared) does not."""
    logits, label_pos = torch.zeros(2, 5, 3), torch.zeros(1, 4, dtype=torch.long)
    assert logits.gather(1, label_pos.unsqueeze(-1).expand(-1, -1, 3)).shape == (1, 4, 3)  # torch is fine with it
    with pytest.raises(Exception, match="(?i)batch"):
        logits_at_labels(logits, label_pos)


@pytest.mark.parametrize("tie_layers", [False, True])
def test_shared_qk_heads_use_their_query_weights_as_keys(gen, tie_layers):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, shared_qk=True, tie_layers=tie_layers)
    model = build_model(cfg, LEGO)
    assert all(b.attn.W_K is b.attn.W_Q and b.attn.b_K is b.attn.b_Q for b in model.blocks)
    assert not any(name.endswith(("W_K", "b_K")) for name in unique_parameters(model))  # saved once
    _, cache = model.run_with_cache(LEGO.sample(3, gen).tokens)
    assert torch.equal(cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"])
    scores = cache["blocks.0.attn.hook_attn_scores"]  # x W W^T x is positive semi-definite per head
    assert (torch.linalg.eigvalsh(scores) > -1e-4).all()
