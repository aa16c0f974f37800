"""Planted (hardcoded) attention heads: chosen heads' patterns are replaced by patterns built from
the token ids alone, row-normalised (LEGO paper, finding 8). The rest of the model trains around
them. They are also the ground truth that the head classifier is calibrated on.

- association:  A_ij = 1[u_i = u_j]            (same token anywhere, self included)
- manipulation: A_ij = 1[seg_i = seg_j]        (inside the query's clause, the task's segments)
- broadcast:    A_ij = 1[u_j = BOS]            (position 0 for tasks without BOS)
- previous:     A_ij = 1[j = i - 1]            (position 0 attends to itself)
- self:         A_ij = 1[j = i]

Shape glossary: batch, head_index, query_pos, key_pos.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tasks import ConfigError, Task

PLANTED_KINDS = ("association", "manipulation", "broadcast", "previous", "self")


def association_pattern(tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch query_pos key_pos"]:
    return _row_normalise(tokens.unsqueeze(2) == tokens.unsqueeze(1))


def manipulation_pattern(segments: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch query_pos key_pos"]:
    return _row_normalise(segments.unsqueeze(2) == segments.unsqueeze(1))


def broadcast_pattern(tokens: Int[Tensor, "batch pos"], bos: int | None) -> Float[Tensor, "batch query_pos key_pos"]:
    targets = tokens == bos if bos is not None else torch.zeros_like(tokens, dtype=torch.bool)
    targets[:, 0] |= ~targets.any(-1)  # no BOS in the row: broadcast to position 0
    return _row_normalise(targets.unsqueeze(1).expand(-1, tokens.shape[1], -1))


def _row_normalise(mask: Tensor) -> Tensor:
    weights = mask.float()
    return weights / weights.sum(-1, keepdim=True)


def planted_pattern(kind: str, tokens: Int[Tensor, "batch pos"],
                    task: Task) -> Float[Tensor, "batch query_pos key_pos"]:
    """The pattern of one planted head; for a causal task, restricted to keys at or before the
    query (and renormalised), as the causal mask would."""
    if kind == "association":
        pattern = association_pattern(tokens)
    elif kind == "manipulation":
        pattern = manipulation_pattern(task.segment_ids(tokens))
    elif kind == "broadcast":
        pattern = broadcast_pattern(tokens, task.bos_token)
    elif kind not in PLANTED_KINDS:
        raise ValueError(f"no planted pattern for {kind!r}; use one of {PLANTED_KINDS}")
    else:
        offset = -1 if kind == "previous" else 0
        n_pos = tokens.shape[1]
        pattern = torch.eye(n_pos, device=tokens.device).roll(offset, dims=1).expand(tokens.shape[0], -1, -1).clone()
        pattern[:, 0] = torch.eye(n_pos, device=tokens.device)[0]
    if task.causal:
        allowed = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).tril()
        pattern = _renormalise(pattern * allowed)
    return pattern


def _renormalise(weights: Tensor) -> Tensor:
    """Rows with no mass left (a causal query before every target) fall back to self-attention."""
    empty = weights.sum(-1, keepdim=True) == 0
    eye = torch.eye(weights.shape[-1], device=weights.device).expand_as(weights)
    weights = torch.where(empty, eye, weights)
    return weights / weights.sum(-1, keepdim=True)


def parse_planted(spec: dict[str, str], n_layers: int, n_heads: int) -> dict[int, dict[int, str]]:
    """{"0.1": "association", "*.0": "broadcast"} -> {layer: {head: kind}}; "*" means every layer."""
    plan: dict[int, dict[int, str]] = {}
    for where, kind in spec.items():
        if kind not in PLANTED_KINDS:
            raise ConfigError(f"model.planted[{where!r}]={kind!r} is unknown; use one of {PLANTED_KINDS}")
        layer, _, head = where.partition(".")
        try:
            layers = range(n_layers) if layer == "*" else [int(layer)]
            head_index = int(head)
        except ValueError:
            raise ConfigError(f"model.planted key {where!r} is not 'layer.head' (layer may be '*')") from None
        if not (all(0 <= x < n_layers for x in layers) and 0 <= head_index < n_heads):
            raise ConfigError(f"model.planted key {where!r} is outside layers 0..{n_layers - 1}, "
                              f"heads 0..{n_heads - 1}")
        for x in layers:
            plan.setdefault(x, {})[head_index] = kind
    return plan


def install_planted_heads(model, task: Task, spec: dict[str, str]) -> None:
    """Replace the chosen heads' `hook_pattern` with planted patterns, as permanent hooks.

    A planted pattern needs the token ids of the forward pass it runs in. A wrapper around the
    model's forward takes them from the input (token ids), from the `tokens=` argument of a
    forward that starts from a residual stream (`start_at_layer`), or from an enclosing
    `token_context(model, tokens)` (batched patching, whose stacked cells are copies of one
    target batch: the ids are tiled to the batch). They hold for that forward only. Anything
    else, such as a block called on its own, fails loudly instead of reusing stale ids.
    """
    plan = parse_planted(spec, model.cfg.n_layers, model.cfg.n_heads)
    state: dict[str, Tensor | None] = {"tokens": None, "context": None}
    original_forward = model.forward

    def forward_with_tokens(input, *args, **kwargs):
        # wrap forward itself, not a forward pre-hook: TransformerLens's run_with_hooks calls
        # model.forward directly, which skips nn.Module hooks
        if isinstance(input, Tensor) and not input.is_floating_point():
            tokens = input
        else:
            tokens = kwargs.get("tokens") if kwargs.get("tokens") is not None else state["context"]
        outer, state["tokens"] = state["tokens"], tokens
        try:
            return original_forward(input, *args, **kwargs)
        finally:
            state["tokens"] = outer

    model.forward = forward_with_tokens
    model.planted_state = state
    for layer, heads in plan.items():
        model.add_hook(f"blocks.{layer}.attn.hook_pattern", _pattern_hook(heads, task, state), is_permanent=True)
    model.planted_plan = plan


def _pattern_hook(heads: dict[int, str], task: Task, state: dict[str, Tensor | None]):
    def hook(pattern: Tensor, hook) -> Tensor:
        tokens = state["tokens"]
        if tokens is None:
            raise RuntimeError(
                f"planted heads in {hook.name}: this forward has no token ids. A forward that starts from a "
                "residual stream must pass tokens=..., or run inside models.planted.token_context(model, tokens)")
        if pattern.shape[0] != tokens.shape[0]:
            if pattern.shape[0] % tokens.shape[0]:
                raise RuntimeError(f"planted heads: batch {pattern.shape[0]} is no multiple of the token ids' "
                                   f"{tokens.shape[0]}")
            tokens = tokens.repeat(pattern.shape[0] // tokens.shape[0], 1)
        pattern = pattern.clone()
        for head, kind in heads.items():
            pattern[:, head] = planted_pattern(kind, tokens.to(pattern.device), task).to(pattern.dtype)
        return pattern

    return hook


@contextlib.contextmanager
def token_context(model, tokens: Int[Tensor, "batch pos"]) -> Iterator[None]:
    """Inside this block, forwards that start from a residual stream without `tokens=` belong
    to these token ids (tiled when their batch is a whole multiple). A no-op for models
    without planted heads."""
    state = getattr(model, "planted_state", None)
    if state is None:
        yield
        return
    outer, state["context"] = state["context"], tokens
    try:
        yield
    finally:
        state["context"] = outer
