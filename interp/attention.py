"""Attention patterns of a HookedTransformer, collected for all layers in one forward pass.

Shape glossary: layer, batch, head_index, query_pos, key_pos (as TransformerLens names them).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer


@torch.no_grad()
def attention_patterns(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "layer batch head_index query_pos key_pos"]:
    """Every layer's attention pattern (`blocks.{l}.attn.hook_pattern`) on these tokens."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[name] for name in names])
