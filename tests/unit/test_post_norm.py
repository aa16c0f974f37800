"""Post-LN blocks (model.norm_position="post"): the composite paper's x -> LN(x + Attn(x)) ->
LN(. + MLP(.)), no final LN, installed on the standard HookedTransformer."""

import pytest
import torch
import torch.nn.functional as F
from transformer_lens.patching import get_act_patch_attn_head_out_by_pos, get_act_patch_resid_pre

from interp.patching import logit_diff_metric, patch_head_out_by_pos, patch_residual
from models.config import ModelConfig
from models.factory import build_model, forward, layers_are_tied
from models.runs import load_run
from tasks import CompositeConfig, CompositeTask, ConfigError, LegoConfig, LegoTask
from tests.helpers import kill_then_resume, tiny_composite_run

COMPOSITE = CompositeTask(CompositeConfig())
LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
POST = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_mlp=64, norm_position="post")


def randomise_norms(model):
    """Norms start at identity; move them so a reference that skipped them would differ."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln_post_" in name:
                param.add_(0.3 * torch.randn_like(param))


def reference_post_ln(model, tokens):
    """A hand-written post-LN forward from the model's weights (causal, learned positions, GELU)."""
    cfg = model.cfg
    x = model.embed.W_E[tokens] + model.pos_embed.W_pos[: tokens.shape[1]]
    n_pos = tokens.shape[1]
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
    for block in model.blocks:
        a = block.attn
        q = torch.einsum("bpd,hde->bphe", x, a.W_Q) + a.b_Q
        k = torch.einsum("bpd,hde->bphe", x, a.W_K) + a.b_K
        v = torch.einsum("bpd,hde->bphe", x, a.W_V) + a.b_V
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.d_head ** 0.5
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        attn_out = torch.einsum("bqhe,hed->bqd", z, a.W_O) + a.b_O
        ln1, ln2 = block.ln_post_attn, block.ln_post_mlp
        mid = F.layer_norm(x + attn_out, (cfg.d_model,), ln1.w, ln1.b, cfg.eps)
        hidden = F.gelu(mid @ block.mlp.W_in + block.mlp.b_in)
        x = F.layer_norm(mid + hidden @ block.mlp.W_out + block.mlp.b_out, (cfg.d_model,), ln2.w, ln2.b, cfg.eps)
    return x @ model.unembed.W_U + model.unembed.b_U  # no final LN


def test_post_ln_equals_a_hand_written_forward(gen):
    model = build_model(POST, COMPOSITE, seed=3)
    randomise_norms(model)
    tokens = COMPOSITE.sample(8, gen).tokens
    with torch.no_grad():
        ours, reference = model(tokens), reference_post_ln(model, tokens)
    assert (ours - reference).abs().max() <= 1e-5
    assert not hasattr(model, "ln_final")
    pre = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=2, d_mlp=64), COMPOSITE, seed=3)
    with torch.no_grad():
        assert (pre(tokens) - reference_post_ln(model, tokens)).abs().max() > 1e-2  # the test can tell


def test_transformer_lens_patching_agrees_on_post_ln(gen):
    model = build_model(POST, COMPOSITE, seed=1)
    randomise_norms(model)
    clean, corrupted, _ = COMPOSITE.counterfactual_pairs(8, gen)
    metric = logit_diff_metric(clean, corrupted, label_index=0)
    _, clean_cache = model.run_with_cache(clean.tokens)
    scalar = lambda logits: metric(logits).mean()  # noqa: E731
    ours = patch_head_out_by_pos(model, clean.tokens, corrupted.tokens, metric)
    theirs = get_act_patch_attn_head_out_by_pos(model, corrupted.tokens, clean_cache, scalar)
    assert (ours.raw - theirs).abs().max() <= 1e-5
    ours = patch_residual(model, clean.tokens, corrupted.tokens, metric)
    theirs = get_act_patch_resid_pre(model, corrupted.tokens, clean_cache, scalar)
    assert (ours.raw - theirs).abs().max() <= 1e-5


def test_post_ln_norms_stay_at_identity_under_init_gamma_and_tie_with_the_layers():
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, norm_position="post", init_gamma=0.8,
                                    tie_layers=True), LEGO)
    norms = {n: p for n, p in model.named_parameters() if ".ln_post_" in n}
    assert norms and all(torch.equal(p, torch.ones_like(p) if n.endswith(".w") else torch.zeros_like(p))
                         for n, p in norms.items())
    assert layers_are_tied(model) and model.blocks[2].ln_post_mlp.w is model.blocks[0].ln_post_mlp.w
    assert model.blocks[0].attn.W_Q.std().item() == pytest.approx(32 ** -0.8, rel=0.1)


def test_post_ln_depth_limited_forward_reads_the_normalised_stream(gen):
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2, norm_position="post"), LEGO)
    tokens = LEGO.sample(4, gen).tokens
    resid = model(tokens, stop_at_layer=2)
    torch.testing.assert_close(forward(model, tokens, depth=2), model.unembed(resid))
    torch.testing.assert_close(forward(model, tokens, depth=3), model(tokens))


def test_post_ln_trains_saves_loads_and_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from models.train import Trainer

    cfg = tiny_composite_run(steps=30).with_overrides(['model.norm_position="post"'])
    Trainer(cfg, tmp_path / "whole", progress=False).fit()
    kill_then_resume(cfg, tmp_path / "killed", monkeypatch, at_step=15)
    whole, resumed = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("whole", "killed"))
    assert any(".ln_post_" in k for k in whole) and all(torch.equal(whole[k], resumed[k]) for k in whole)
    run = load_run(tmp_path / "whole")
    assert not torch.equal(run.model.blocks[0].ln_post_attn.w, torch.ones(32))  # the norms trained and loaded


def test_post_ln_needs_layer_norm():
    with pytest.raises(ConfigError, match="norm_position='post' needs model.normalization='LN'"):
        ModelConfig(norm_position="post", normalization="RMS")
    with pytest.raises(ConfigError, match="model.norm_position='middle'"):
        ModelConfig(norm_position="middle")
