"""Path patching (Wang et al. 2022, the IOI circuit; ARENA's exercises): which heads feed which.

Exact patching (`interp.patching`) says how much the metric depends on a head. Path patching
says *through what*: the effect of one sender head's output on the metric along one path only,

    sender -> receiver   into one later head's query, key or value input
    sender -> logits     directly, through no other component

The definition is strict. In the target run, the sender head's output becomes the source run's
and every other component (every other head, every MLP) is frozen at its target value; only the
path's end sees the change. Directions and normalisation are those of exact patching: with
`clean_to_corrupted` the target is the corrupted run and the source the clean one, and values
are (m - m_corrupted) / (m_clean - m_corrupted), so an edge's value is the share of the clean
behaviour that this edge alone restores.

Batched, without a forward per path: in a pre-LN model the residual stream is the sum of its
components' outputs, so with everything but the sender frozen, the input of any later block is
the target's plus delta = (z_source - z_target) W_O[head] of the sender. The receiver's q/k/v
is its block's ln1 of that, through W_Q/W_K/W_V (plus the positional embedding for a shortformer
model's q and k); it is swapped into stacked copies of the target run from the receiver's layer
on, one copy per sender (downstream of the receiver everything recomputes). Direct effects need
no rerun: unembed(ln_final(target's last residual + delta)), soft-capped where the model caps
its logits.

Grouped key/value heads (`n_key_value_heads`): a receiver is a query head, and its key and value
are its own copy of its group's (TransformerLens's `ungroup_grouped_query_attention`, switched on
for the call: the same numbers), so a k or v edge changes what that one head reads.

Every `HookedTransformerConfig` option that changes how a head's output reaches a later head is
either checked against `path_patch_reference` (tests/unit/test_model_options.py) or refused by
`check_path_patchable`, naming the option; the table is in docs/limits.md.

Shape glossary: batch = counterfactual pairs, pos = token positions, sender = (layer, head)
flattened, d_model, d_head, head_index.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching import (
    DEFAULT_MAX_BATCH,
    DIRECTIONS,
    Metric,
    baseline_metrics,
    forward_from,
    mean_metric,
    normalise,
    shortformer_positions,
    source_target_slices,
)
from models.factory import final_norm, is_post_norm

INPUTS = ("q", "k", "v")  # a receiver head's inputs


@dataclass
class PathPatchResult:
    """Every head-to-head edge and every head's direct effect on the logits.

    edges[ls, hs, lr, hr, i]: sender head (ls, hs) -> receiver head (lr, hr) through input
    INPUTS[i], normalised (0 = target behaviour, 1 = source's); NaN where lr <= ls (no path).
    direct[ls, hs]: sender -> logits. `*_raw` hold the metric's mean over the pairs.
    """

    edges: Float[Tensor, "layer head layer head input"]
    edges_raw: Float[Tensor, "layer head layer head input"]
    direct: Float[Tensor, "layer head"]
    direct_raw: Float[Tensor, "layer head"]
    direction: str
    clean_metric: float
    corrupted_metric: float

    def strongest(self, k: int | None = 10) -> list[tuple[str, str, float]]:
        """The k edges and direct effects with the largest |value| (None: all of them):
        ("L0H1", "L1H0.v", 0.42), with "logits" as the receiver of a direct effect."""
        cells = [(f"L{ls}H{hs}", f"L{lr}H{hr}.{INPUTS[i]}", value)
                 for (ls, hs, lr, hr, i), value in _finite_cells(self.edges)]
        cells += [(f"L{ls}H{hs}", "logits", value) for (ls, hs), value in _finite_cells(self.direct)]
        return sorted(cells, key=lambda cell: -abs(cell[2]))[:k]

    def to_dict(self) -> dict[str, Any]:
        def nan_to_none(t: Tensor) -> list:
            return [[None if v != v else v for v in row] for row in t.flatten(0, -2).tolist()]

        return {"inputs": list(INPUTS), "edges_shape": list(self.edges.shape), "edges": nan_to_none(self.edges),
                "direct": self.direct.tolist(), "direct_raw": self.direct_raw.tolist(), "direction": self.direction,
                "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                "strongest": self.strongest()}


def _finite_cells(values: Tensor) -> list[tuple[tuple[int, ...], float]]:
    return [(tuple(index), values[tuple(index)].item()) for index in values.isfinite().nonzero().tolist()]


def check_path_patchable(model: HookedTransformer) -> None:
    """Path patching and edge ablation (interp.circuit) need each head's output to reach later
    layers as an additive term through W_O, and a receiver's q/k/v to be ln1(its block's input)
    @ W_Q/W_K/W_V + bias at hook_q/k/v. ValueError naming the option that breaks it, if any
    (the table of options: docs/limits.md)."""
    cfg = model.cfg
    if is_post_norm(model):
        raise ValueError("path patching refuses model.norm_position='post' (post-LN): every block renormalises the "
                         "residual stream, so a head's output does not reach later layers as an additive term")
    if any(hasattr(block.attn, "identity_a") for block in model.blocks):
        raise ValueError("path patching refuses model.identity_attention=true (identity-augmented attention): its "
                         "scores and outputs read the residual stream directly, past the q/k/v inputs and the "
                         "hook_z outputs patched here")
    if getattr(cfg, "use_normalization_before_and_after", False):
        raise ValueError("path patching refuses use_normalization_before_and_after=True: the norm after attention "
                         "(ln1_post) rescales the sum of a layer's heads, so one head's output does not reach later "
                         "layers as an additive term of its own")
    if getattr(cfg, "original_architecture", None) in _post_norm_architectures():
        raise ValueError(f"path patching refuses original_architecture={cfg.original_architecture!r}: its blocks "
                         "normalise attention and MLP outputs before the residual add (post-norm), so a head's output "
                         "does not reach later layers as an additive term")
    if getattr(cfg, "load_in_4bit", False):
        raise ValueError("path patching refuses load_in_4bit=True: it multiplies by W_Q, W_K, W_V and W_O directly, "
                         "and 4-bit weights are not plain matrices")


def _post_norm_architectures() -> set[str]:
    try:
        from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES
    except ImportError:  # an older TransformerLens 3.x: no post-norm architectures
        return set()
    return set(POST_NORM_ARCHITECTURES)


@contextmanager
def per_head_inputs(model: HookedTransformer, split_qkv: bool = False) -> Iterator[None]:
    """Within: every query head has its own key and value (`ungroup_grouped_query_attention`, a
    no-op without grouped key/value heads: the same numbers, one copy per query head), so
    `hook_k`/`hook_v` index query heads; with `split_qkv`, its own copy of each q/k/v input
    (`use_split_qkv_input`). The model's settings are restored on the way out."""
    cfg = model.cfg
    saved = getattr(cfg, "ungroup_grouped_query_attention", False), cfg.use_split_qkv_input
    try:
        cfg.ungroup_grouped_query_attention = True
        cfg.use_split_qkv_input = split_qkv or saved[1]
        yield
    finally:
        cfg.ungroup_grouped_query_attention, cfg.use_split_qkv_input = saved


def logits_from_resid(model: HookedTransformer,
                      resid: Float[Tensor, "... pos d_model"]) -> Float[Tensor, "... pos d_vocab_out"]:
    """What a full forward makes of the last block's output: the final norm, the unembedding and,
    where the model caps its logits (`output_logits_soft_cap`), cap * tanh(logits / cap)."""
    logits = model.unembed(final_norm(model, resid))
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0)
    return cap * torch.tanh(logits / cap) if cap is not None and cap > 0 else logits


@torch.no_grad()
def path_patch(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", max_batch: int = DEFAULT_MAX_BATCH,
) -> PathPatchResult:
    """Every sender head -> receiver head (q, k, v) edge and every head's direct effect."""
    check_path_patchable(model)
    if clean_tokens.dim() != 2 or clean_tokens.shape != corrupted_tokens.shape:
        raise ValueError(f"clean_tokens {tuple(clean_tokens.shape)} and corrupted_tokens "
                         f"{tuple(corrupted_tokens.shape)} must both be [batch pos] with the same shape")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is unknown; use one of {DIRECTIONS}")
    n_layers, n_heads, n = model.cfg.n_layers, model.cfg.n_heads, clean_tokens.shape[0]
    last = f"blocks.{n_layers - 1}.hook_resid_post"
    keep = {f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)} | {last}
    keep |= {f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)}
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]), names_filter=lambda h: h in keep)
    clean_metric, corrupted_metric = baseline_metrics(metric, logits, n)
    source, target = source_target_slices(direction, n)
    target_tokens = (corrupted_tokens if direction == DIRECTIONS[0] else clean_tokens)
    deltas = sender_deltas(model, cache, source, target)  # [sender batch pos d_model]

    direct_raw = torch.stack([mean_metric(metric, logits_from_resid(model, cache[last][target] + delta))
                              for delta in deltas]).view(n_layers, n_heads).cpu()
    edges_raw = torch.full((n_layers, n_heads, n_layers, n_heads, len(INPUTS)), float("nan"), dtype=direct_raw.dtype)
    for receiver_layer in range(1, n_layers):
        senders = deltas[: receiver_layer * n_heads]  # every head of an earlier layer
        with per_head_inputs(model):
            effects = _receiver_layer_edges(model, receiver_layer,
                                            cache[f"blocks.{receiver_layer}.hook_resid_pre"][target],
                                            target_tokens, senders, metric, max_batch)  # [sender head input]
        edges_raw[:receiver_layer, :, receiver_layer] = effects.view(receiver_layer, n_heads, n_heads, len(INPUTS))
    return PathPatchResult(normalise(edges_raw, clean_metric, corrupted_metric), edges_raw,
                           normalise(direct_raw, clean_metric, corrupted_metric), direct_raw,
                           direction, clean_metric, corrupted_metric)


def sender_deltas(model: HookedTransformer, cache: Any, source: slice,
                  target: slice) -> Float[Tensor, "sender batch pos d_model"]:
    """What each head adds to the residual stream when its output becomes the source's: the
    change of its z through its rows of W_O (b_O is shared by source and target and cancels)."""
    per_layer = []
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        per_layer.append(torch.einsum("bphe,hed->hbpd", z[source] - z[target], model.blocks[layer].attn.W_O))
    return torch.cat(per_layer)


def _receiver_layer_edges(
    model: HookedTransformer, layer: int, target_resid: Float[Tensor, "batch pos d_model"],
    target_tokens: Int[Tensor, "batch pos"], senders: Float[Tensor, "sender batch pos d_model"], metric: Metric,
    max_batch: int,
) -> Float[Tensor, "sender head input"]:
    """For every sender and every head of `layer`, and each of its inputs: the metric when that
    input alone is computed from the residual stream with the sender's change in it. Grouped
    key/value heads must be ungrouped (`per_head_inputs`): hook_k and hook_v index query heads."""
    attn, n = model.blocks[layer].attn, target_resid.shape[0]
    normalised = model.blocks[layer].ln1(target_resid + senders)  # [sender batch pos d_model]
    positions = shortformer_positions(model, target_resid)  # added to q's and k's inputs, or None
    weights = {"q": (attn.W_Q, attn.b_Q), "k": (attn.W_K, attn.b_K), "v": (attn.W_V, attn.b_V)}
    out = torch.empty(len(senders), model.cfg.n_heads, len(INPUTS), dtype=target_resid.dtype)
    per_run = max(1, max_batch // n)
    for i, name in enumerate(INPUTS):
        w, b = weights[name]
        inputs = normalised if positions is None or name == "v" else normalised + positions
        patched = torch.einsum("sbpd,hde->sbphe", inputs, w) + b  # [sender batch pos head d_head]
        for head in range(model.cfg.n_heads):
            for chunk in torch.arange(len(senders)).split(per_run):
                values = patched[chunk, ..., head, :].flatten(0, 1)  # [copies*batch pos d_head]

                def swap(activation: Tensor, hook: Any, values: Tensor = values, head: int = head) -> Tensor:
                    activation[:, :, head] = values
                    return activation

                with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_{name}", swap)]):
                    logits = forward_from(model, target_resid.repeat(len(chunk), 1, 1), layer,
                                          tokens=target_tokens.repeat(len(chunk), 1))
                logits = logits.view(len(chunk), n, *logits.shape[1:])
                out[chunk, head, i] = torch.stack([mean_metric(metric, copy) for copy in logits]).cpu()
    return out


def path_patch_reference(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    sender: tuple[int, int], receiver: tuple[int, int, str] | None, direction: str = "clean_to_corrupted",
) -> float:
    """One path by the textbook recipe, two hooked TransformerLens forwards (the slow reference
    the tests check `path_patch` against). Returns the raw mean metric. `receiver` None: the
    direct path to the logits. A receiver is a query head, with its own copy of a grouped key and
    value (`per_head_inputs`)."""
    with per_head_inputs(model):
        return _path_reference(model, clean_tokens, corrupted_tokens, metric, sender, receiver, direction)


def _path_reference(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric,
    sender: tuple[int, int], receiver: tuple[int, int, str] | None, direction: str,
) -> float:
    clean_first = direction == DIRECTIONS[0]
    source_tokens, target_tokens = (clean_tokens, corrupted_tokens) if clean_first else (corrupted_tokens, clean_tokens)
    _, source_cache = model.run_with_cache(source_tokens)
    _, target_cache = model.run_with_cache(target_tokens)
    layer_s, head_s = sender

    def freeze_heads(z: Tensor, hook: Any) -> Tensor:
        frozen = target_cache[hook.name].clone()
        if hook.layer() == layer_s:
            frozen[:, :, head_s] = source_cache[hook.name][:, :, head_s]
        return frozen

    freeze_mlps = lambda out, hook: target_cache[hook.name]  # noqa: E731
    hooks = [(lambda name: name.endswith("attn.hook_z"), freeze_heads),
             (lambda name: name.endswith("hook_mlp_out"), freeze_mlps)]
    if receiver is None:
        with model.hooks(fwd_hooks=hooks):
            return mean_metric(metric, model(target_tokens)).item()
    layer_r, head_r, name = receiver
    point = f"blocks.{layer_r}.attn.hook_{name}"
    stored: dict[str, Tensor] = {}
    with model.hooks(fwd_hooks=[*hooks, (point, lambda act, hook: stored.setdefault("act", act.clone()))]):
        model(target_tokens)

    def swap(act: Tensor, hook: Any) -> Tensor:
        act[:, :, head_r] = stored["act"][:, :, head_r]
        return act

    with model.hooks(fwd_hooks=[(point, swap)]):
        return mean_metric(metric, model(target_tokens)).item()
