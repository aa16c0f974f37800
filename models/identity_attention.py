"""Identity-augmented attention (Boix-Adsera et al., ICLR 2024): per head two trainable scalars
a_h, b_h, both starting at 0, so a fresh model computes exactly what the plain one does.

    scores_h += a_h * X X^T / sqrt(d_model)     (W_Q W_K^T + a_h I: attend to the same symbol)
    attn_out += sum_h b_h * A_h X               (W_V W_O + b_h I: copy the attended symbol)

X is the attention input (`blocks.{l}.ln1.hook_normalized`). Installed as permanent hooks on the
standard model, so hook names stay as TransformerLens has them. The b_h term joins `hook_attn_out`
(not `attn.hook_z`/`hook_result`), so per-head patching sees only the W_V W_O part of a head.

Shape glossary: batch, head_index, query_pos, key_pos, pos, d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def install_identity_attention(model, off_diagonal: bool = False) -> None:
    """Give every block's attention a_h, b_h (as `attn.identity_a`, `attn.identity_b`) and the
    hooks that use them. Call before tying layers, so tied blocks share them too. `off_diagonal`
    leaves each position's similarity with itself out of the a_h term."""
    for layer, block in enumerate(model.blocks):
        block.attn.identity_a = nn.Parameter(torch.zeros(model.cfg.n_heads))
        block.attn.identity_b = nn.Parameter(torch.zeros(model.cfg.n_heads))
        state: dict[str, Tensor] = {}
        model.add_hook(f"blocks.{layer}.ln1.hook_normalized", _remember("x", state), is_permanent=True)
        model.add_hook(f"blocks.{layer}.attn.hook_attn_scores", _add_identity_scores(block.attn, state, off_diagonal),
                       is_permanent=True)
        model.add_hook(f"blocks.{layer}.attn.hook_pattern", _remember("pattern", state), is_permanent=True)
        model.add_hook(f"blocks.{layer}.hook_attn_out", _add_identity_output(block.attn, state), is_permanent=True)


def _remember(key: str, state: dict[str, Tensor]):
    def hook(value: Tensor, hook) -> Tensor:
        state[key] = value
        return value

    return hook


def _add_identity_scores(attn: nn.Module, state: dict[str, Tensor], off_diagonal: bool):
    def hook(scores: Tensor, hook) -> Tensor:  # [batch head_index query_pos key_pos]
        x = state["x"]  # [batch pos d_model]
        similarity = torch.einsum("bqd,bkd->bqk", x, x) / math.sqrt(x.shape[-1])
        if off_diagonal:
            similarity = similarity * (1 - torch.eye(x.shape[1], device=x.device, dtype=x.dtype))
        return scores + attn.identity_a[None, :, None, None] * similarity[:, None]

    return hook


def _add_identity_output(attn: nn.Module, state: dict[str, Tensor]):
    def hook(out: Tensor, hook) -> Tensor:  # [batch pos d_model]
        copied = torch.einsum("bhqk,bkd,h->bqd", state["pattern"], state["x"], attn.identity_b)
        # the block's last use of them: a tensor kept past its forward would hold memory, and
        # torch.compile would find a previous call's (torch.func-wrapped) tensor in the dict
        state.clear()
        return out + copied

    return hook
