"""The one place that constructs TransformerLens models: `build_model(model_cfg, task)`.

Variants are options of the one factory: encoder or decoder (from the task), init scale
(`init_gamma`), post-LN blocks, tied layers (ALBERT), and a depth-limited forward for
stochastic depth.
"""

from __future__ import annotations

import warnings
from typing import no_type_check

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from models.config import ModelConfig
from models.identity_attention import install_identity_attention
from models.planted import install_planted_heads
from tasks import ConfigError, Task

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformer_lens import HookedTransformer, HookedTransformerConfig



def build_model(cfg: ModelConfig, task: Task, seed: int = 0, device: str | torch.device = "cpu") -> HookedTransformer:
    """A fresh HookedTransformer for `task`: bidirectional encoder with a class head for LEGO,
    causal decoder for composite. Initialisation is seeded without touching the global RNG."""
    n_ctx = cfg.n_ctx or task.n_ctx
    if task.n_ctx > n_ctx:
        raise ConfigError(f"the task's sequences have {task.n_ctx} tokens but model.n_ctx={n_ctx}; use model.n_ctx >= "
                          f"{task.n_ctx}")
    tl_cfg = HookedTransformerConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.head_dim,
        d_mlp=cfg.mlp_dim, d_vocab=task.d_vocab, d_vocab_out=task.d_vocab_out, n_ctx=n_ctx,
        act_fn=cfg.act_fn, normalization_type=None if cfg.norm_position == "post" else cfg.normalization,
        attention_dir="causal" if task.causal else "bidirectional", default_prepend_bos=False,
        positional_embedding_type=cfg.positional, rotary_dim=cfg.head_dim // 2 if cfg.positional == "rotary" else None,
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # TL 3.x warns on every construction that 4.0 replaces HookedTransformer; we pin <4 on
        # purpose (docs/design.md, Decisions), so the warning carries no news for our users
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.manual_seed(seed)
        model = HookedTransformer(tl_cfg)
        for block in model.blocks:
            # a Python float, not TransformerLens's numpy scalar: torch.compile cannot trace numpy
            # values under torch.func's transforms (the training step, models/step.py); same value
            block.attn.attn_scale = float(block.attn.attn_scale)
        if cfg.init_gamma is not None:
            apply_init_scale(model, cfg.init_gamma)
        if cfg.unembed_bias_init == "uniform":
            bound = cfg.d_model ** -0.5  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            torch.nn.init.uniform_(model.unembed.b_U, -bound, bound)
    if not cfg.biases:
        remove_biases(model)  # before tying: the tied blocks share block 0's frozen zeros
    if cfg.norm_position == "post":
        install_post_norm(model)  # before tying, so tied blocks share their norms too
    if cfg.fixed_embeddings:
        fix_embeddings(model)
    if cfg.identity_attention:
        install_identity_attention(model, cfg.identity_off_diagonal)  # before tying, so tied blocks share a_h, b_h
    if cfg.tie_layers:
        tie_layers(model)
    if cfg.shared_qk:
        share_query_key(model)  # after tying, so every tied block's W_K is block 0's W_Q
    if cfg.planted:
        install_planted_heads(model, task, cfg.planted)
    return model.to(device, print_details=False)


def fan_in(name: str, param: Tensor) -> int:
    """The input dimension a weight matrix contracts over (its d_in).

    Embeddings and positional embeddings count their width d_model, as nn.Embedding's
    convention of the last axis; W_O contracts over all heads' outputs (n_heads * d_head).
    """
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "W_O":
        return param.shape[0] * param.shape[1]
    if leaf in ("W_E", "W_pos"):
        return param.shape[-1]
    return param.shape[-2]  # W_Q/W_K/W_V [head, d_model, d_head], W_in, W_out, W_U [d_in, d_out]


def apply_init_scale(model: HookedTransformer, gamma: float) -> None:
    """Redraw every weight matrix from N(0, d_in^(-2 gamma)) and zero the biases; norms keep
    their identity init. Larger gamma means smaller initial weights."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("W_"):
                param.normal_(0.0, fan_in(name, param) ** -gamma)
            elif leaf.startswith("b_"):
                param.zero_()


BIASES = ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out")  # attention and MLP; not the norms' or the unembedding's


def remove_biases(model: HookedTransformer) -> None:
    """A bias-free model (`model.biases=false`, the composite paper's): every attention and MLP
    bias set to zero and frozen. A frozen parameter gets no gradient, so AdamW never moves it
    (weight decay included), and the block computes exactly what one without the bias would."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1] in BIASES:
                param.zero_()
                param.requires_grad_(False)


def install_post_norm(model: HookedTransformer) -> None:
    """Post-LN blocks on a model built without norms (normalization_type=None): a trained
    LayerNorm applied at each block's `hook_resid_mid` and `hook_resid_post` by permanent hooks,
    so that block l computes mid = LN(x + Attn(x)), out = LN(mid + MLP(mid)), and no final LN.

    The norms are submodules of their block (`blocks.{l}.ln_post_attn`, `.ln_post_mlp`), so they
    are saved, loaded, tied and optimised like any parameter, and start at identity (init_gamma
    leaves them alone). The hook names keep their meaning, and hold the normalised stream: what
    the next sublayer reads, what a cache records and what patching replaces. The residual
    stream is then no longer a sum of component outputs (README, Known limits)."""
    from transformer_lens.components import LayerNorm

    for layer, block in enumerate(model.blocks):
        block.ln_post_attn, block.ln_post_mlp = LayerNorm(model.cfg), LayerNorm(model.cfg)
        for point, norm in (("hook_resid_mid", block.ln_post_attn), ("hook_resid_post", block.ln_post_mlp)):
            model.add_hook(f"blocks.{layer}.{point}", _apply_norm(norm), is_permanent=True)
    model.post_norm = True


def _apply_norm(norm: nn.Module):
    def hook(resid: Tensor, hook) -> Tensor:
        return norm(resid)

    return hook


def is_post_norm(model: HookedTransformer) -> bool:
    return getattr(model, "post_norm", False)


def fix_embeddings(model: HookedTransformer) -> None:
    """Freeze the token embeddings at their init and read logits with them: W_U = W_E^T, both
    frozen (two equal tensors, not one aliased one, so weights files stay alias-free)."""
    if model.cfg.d_vocab_out != model.cfg.d_vocab:
        raise ConfigError(f"model.fixed_embeddings needs one vocabulary in and out; the task has d_vocab="
                          f"{model.cfg.d_vocab}, d_vocab_out={model.cfg.d_vocab_out}")
    with torch.no_grad():
        model.unembed.W_U.copy_(model.embed.W_E.T)
    model.embed.W_E.requires_grad_(False)
    model.unembed.W_U.requires_grad_(False)


def tie_layers(model: HookedTransformer) -> None:
    """ALBERT: make every block's parameters *the same* nn.Parameter objects as block 0's.
    Each block stays its own module, so hook names (`blocks.3.attn.hook_pattern`) are per layer."""
    source = dict(model.blocks[0].named_parameters())
    for block in model.blocks[1:]:
        for name, param in source.items():
            owner_path, _, leaf = name.rpartition(".")
            owner = block.get_submodule(owner_path) if owner_path else block
            setattr(owner, leaf, param)


def share_query_key(model: HookedTransformer) -> None:
    """Make every attention's W_K and b_K *the same* parameters as its W_Q and b_Q (hooks and
    hook names unchanged: `hook_k` still records the keys)."""
    for block in model.blocks:
        block.attn.W_K = block.attn.W_Q
        block.attn.b_K = block.attn.b_Q


def layers_are_tied(model: HookedTransformer) -> bool:
    first = list(model.blocks[0].parameters())
    return all(
        all(a is b for a, b in zip(first, block.parameters())) for block in model.blocks[1:]
    )


def forward(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], depth: int | None = None
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """Logits from the first `depth` blocks (all of them when None): stochastic depth skips the
    top blocks and reads the residual stream through the final norm and unembedding."""
    if depth is None or depth >= model.cfg.n_layers:
        return model(tokens)
    return model.unembed(final_norm(model, model(tokens, stop_at_layer=depth)))


@no_type_check  # traced by torch.compile (models/step.py), which cannot trace the tests' type-checking wrappers
def final_norm(model, resid):
    """The norm before the unembedding; none in post-LN models, whose blocks end normalised."""
    norm = getattr(model, "ln_final", None)
    return norm(resid) if norm is not None else resid


def unique_parameters(model: nn.Module) -> dict[str, Tensor]:
    """Parameters by their first name; tied copies appear once (safetensors refuses aliases)."""
    return dict(model.named_parameters())
