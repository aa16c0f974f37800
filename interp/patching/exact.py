"""Exact activation patching: stacked copies of the target batch that rerun no block they need not."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint

from interp.patching.metrics import LogitDiff, Metric, mean_metric
from interp.patching.sweep import (
    ACTIVATIONS,
    DEFAULT_MAX_BATCH,
    DIRECTIONS,
    Activation,
    PatchResult,
    _Cells,
    _cells,
    _result,
    _Sweep,
    _validate,
    baseline_metrics,
    source_target_slices,
)
from models.planted import token_context


@torch.no_grad()
def activation_patch(
    model: HookedTransformer,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    kind: str = "resid_pre",
    over: Sequence[str] = ("pos",),
    *,
    direction: str = "clean_to_corrupted",
    layers: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """Exact patching of activation `kind` (a key of ACTIVATIONS), one cell per index of the
    axes in `over` per layer (`over=()` patches the whole activation of a layer at once).

    Costs one forward pass of both inputs; then per layer l, blocks before l never rerun. For an
    activation inside block l (every kind but resid_pre), block l runs once per group of cells
    that differ only in position (a patch at one position changes block l's output only at that
    position), and each cell's copy of the target batch starts at block l+1.
    """
    sweep = _validate(model, clean_tokens, corrupted_tokens, kind, over, direction, layers, max_batch)
    cells = _cells(model, sweep, clean_tokens.shape[1], clean_tokens.device)
    raw, clean_metric, corrupted_metric = _exact_cells(model, clean_tokens, corrupted_tokens, metric, sweep,
                                                       [cells] * len(sweep.layers), max_batch)
    return _result(sweep, torch.stack(raw).view(cells.shape).cpu(), "exact", clean_metric, corrupted_metric)


def _exact_cells(
    model: HookedTransformer, clean_tokens: Tensor, corrupted_tokens: Tensor, metric: Metric, sweep: _Sweep,
    per_layer: Sequence[_Cells | None], max_batch: int,
) -> tuple[list[Tensor], float, float]:
    """The metric's mean for the cells `per_layer` holds for each swept layer (None: none), and
    both baselines, from one cached forward pass of both inputs."""
    n = clean_tokens.shape[0]
    pre, post = ACTIVATIONS["resid_pre"], ACTIVATIONS["resid_post"]
    keep = {a.name(layer) for layer in sweep.layers for a in (pre, post, sweep.activation)}
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]), names_filter=lambda h: h in keep)
    target_tokens = corrupted_tokens if sweep.direction == DIRECTIONS[0] else clean_tokens
    clean_metric, corrupted_metric = baseline_metrics(metric, logits, n)
    source, target = source_target_slices(sweep.direction, n)
    raw = []
    with token_context(model, target_tokens):  # planted heads: the runs below start from a residual stream
        for layer, layer_cells in zip(sweep.layers, per_layer):
            if layer_cells is None:
                raw.append(torch.zeros(0, device=logits.device))
                continue
            raw.append(_sweep_layer(model, layer, sweep.activation, cache[pre.name(layer)][target],
                                    cache[post.name(layer)][target], cache[sweep.activation.name(layer)][source],
                                    layer_cells, metric, max_batch))
    return raw, clean_metric, corrupted_metric


def _sweep_layer(
    model: HookedTransformer, layer: int, activation: Activation, target_pre: Tensor, target_post: Tensor,
    source_act: Tensor, cells: _Cells, metric: Metric, max_batch: int,
) -> Float[Tensor, " cell"]:
    """The metric's mean per cell of one layer, from stacked runs of one copy of the target
    batch per cell, `max_batch` samples at a time."""
    hook_name = activation.name(layer)
    # every run below reaches the last block, except the cells of a local activation in it
    reaches_last_block = not activation.local or layer + 1 < model.cfg.n_layers
    final_hooks, metric = _narrowed_last_block(model, metric) if reaches_last_block else ([], metric)
    if not activation.local:  # block l's attention mixes positions: rerun block l per cell
        outputs = _patched_runs(model, target_pre, layer, hook_name, source_act, cells.masks, max_batch,
                                final_hooks=final_hooks)
    else:
        group_post = torch.cat(list(_patched_runs(model, target_pre, layer, hook_name, source_act, cells.groups,
                                                   max_batch, stop_at_layer=layer + 1)))
        outputs = _runs_after_block(model, layer, cells, group_post, target_post, max_batch, final_hooks)
    return torch.stack([mean_metric(metric, copy) for logits in outputs for copy in logits])


def _narrowed_last_block(model: HookedTransformer, metric: Metric,
                         queries: bool = True) -> tuple[list[tuple[str, Any]], Metric]:
    """When the metric reads the logits at one known position per pair (`LogitDiff`), the last
    block's MLP, the final norm and the unembedding need to run there only: a hook keeps just
    those rows of the last block's resid_mid (its attention still sees every position), and the
    returned metric reads position 0 of the narrowed logits. Other metrics and architectures
    (parallel or no MLP, post-norm) run in full: ([], metric). `queries`: narrow the last block's
    attention too (`_narrowed_last_queries`); attribution, which reads gradients of that block's
    activations at every position, does not."""
    cfg = model.cfg
    if not isinstance(metric, LogitDiff) or cfg.attn_only or cfg.parallel_attn_mlp \
            or not hasattr(model.blocks[-1], "hook_resid_mid") or getattr(model.blocks[-1], "ln2", None) is None:
        return [], metric
    positions = metric.pos

    def keep_label_rows(resid_mid: Tensor, hook: Any) -> Tensor:
        rows = positions.to(resid_mid.device).repeat(resid_mid.shape[0] // len(positions))
        return resid_mid[torch.arange(len(rows), device=resid_mid.device), rows].unsqueeze(1)  # [batch 1 d_model]

    at_zero = LogitDiff(torch.zeros_like(positions), metric.clean_label, metric.corrupted_label)
    narrowed = _narrowed_last_queries(model, positions) if queries else []
    return [*narrowed, (f"blocks.{cfg.n_layers - 1}.hook_resid_mid", keep_label_rows)], at_zero


def _narrowed_last_queries(model: HookedTransformer, positions: Tensor) -> list[tuple[str, Any]]:
    """The last block's attention, too, needs its label query only: a hook keeps those rows of
    its queries (after rotary, where the model has it), so its scores, pattern and output are one
    row per sequence, which the residual add broadcasts and `keep_label_rows` then picks at the
    label position. Only for bidirectional attention (a causal mask would index rows by query
    position) whose last block carries no hooks of its own (planted heads, identity-augmented
    attention), and whose scores depend on a query's position only through its q (not ALiBi's
    bias or log-n scaling, which would read the kept row as position 0), else []."""
    block, cfg = model.blocks[-1], model.cfg
    own_hooks = any(point.fwd_hooks for point in block.modules() if isinstance(point, HookPoint))
    by_position = cfg.positional_embedding_type == "alibi" or getattr(cfg, "use_logn_attn", False)
    if cfg.attention_dir != "bidirectional" or own_hooks or cfg.use_split_qkv_input or cfg.use_attn_in or by_position:
        return []
    name = "hook_rot_q" if cfg.positional_embedding_type == "rotary" else "hook_q"

    def keep_label_queries(q: Tensor, hook: Any) -> Tensor:  # [batch pos head_index d_head] -> [batch 1 ...]
        rows = positions.to(q.device).repeat(q.shape[0] // len(positions))
        return q[torch.arange(len(rows), device=q.device), rows].unsqueeze(1)

    return [(f"blocks.{cfg.n_layers - 1}.attn.{name}", keep_label_queries)]


def _patched_runs(
    model: HookedTransformer, resid_pre: Tensor, layer: int, hook_name: str, source_act: Tensor, masks: Tensor,
    max_batch: int, stop_at_layer: int | None = None, final_hooks: Sequence[tuple[str, Any]] = (),
) -> Iterator[Tensor]:
    """Blocks layer..stop on one copy of the target batch per mask, each copy's activation
    patched where its mask is True; yields [mask batch ...] per chunk of masks. `final_hooks`
    (`_narrowed_last_block`) apply to runs that reach the logits."""
    n = resid_pre.shape[0]
    extra = list(final_hooks) if stop_at_layer is None else []
    for chunk in masks.split(max(1, max_batch // n)):
        hook = partial(_patch_copies, source=source_act, masks=chunk)
        with model.hooks(fwd_hooks=[(hook_name, hook), *extra]):
            out = forward_from(model, resid_pre.repeat(len(chunk), 1, 1), layer, stop_at_layer=stop_at_layer)
        yield out.view(len(chunk), n, *out.shape[1:])


def forward_from(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"], layer: int,
                 **kwargs: Any) -> Tensor:
    """`model(resid, start_at_layer=layer, **kwargs)`, with what a full forward gives every block
    besides the residual stream: a shortformer model's positional embedding, which its blocks add
    to the inputs of queries and keys (and which `start_at_layer` alone leaves out)."""
    return model(resid, start_at_layer=layer, shortformer_pos_embed=shortformer_positions(model, resid), **kwargs)


def shortformer_positions(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"]) -> Tensor | None:
    """The positional embedding a shortformer model adds to queries' and keys' inputs in every
    block, [batch pos d_model] (the same rows for every sequence); None for any other model."""
    if model.cfg.positional_embedding_type != "shortformer":
        return None
    return model.pos_embed(torch.zeros(resid.shape[:2], dtype=torch.long, device=resid.device))


def _patch_copies(act: Tensor, hook: Any, source: Tensor, masks: Tensor) -> Tensor:
    """Hook: copy c of the stacked batch takes the source activation where masks[c] is True."""
    copies = act.reshape(len(masks), -1, *act.shape[1:])  # [cell batch pos (head_index) feature]
    where = masks.unsqueeze(1).unsqueeze(-1)  # [cell 1 pos (head_index) 1]
    return torch.where(where, source, copies).flatten(0, 1)


def _runs_after_block(
    model: HookedTransformer, layer: int, cells: _Cells, group_post: Tensor, target_post: Tensor, max_batch: int,
    final_hooks: Sequence[tuple[str, Any]] = (),
) -> Iterator[Tensor]:
    """Blocks layer+1.. on one copy of the target batch per cell, starting from the residual
    stream after block l: the target's, except at the positions the cell changes, which come
    from its group's patched run. Yields logits [cell batch pos d_vocab_out] per chunk."""
    n = target_post.shape[0]
    for chunk in torch.arange(len(cells.masks), device=target_post.device).split(max(1, max_batch // n)):
        where = cells.positions[chunk][:, None, :, None]  # [cell 1 pos 1]
        resid = torch.where(where, group_post[cells.group_of[chunk]], target_post)  # [cell batch pos d_model]
        with model.hooks(fwd_hooks=list(final_hooks)):
            logits = forward_from(model, resid.flatten(0, 1), layer + 1)
        yield logits.view(len(chunk), n, *logits.shape[1:])


def patch_residual(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """Residual stream at the start of each block (`hook_resid_pre`), layer x pos."""
    return activation_patch(model, clean_tokens, corrupted_tokens, metric, "resid_pre", ("pos",),
                            direction=direction, layers=layers, max_batch=max_batch)


def patch_head_out(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """Each head's output (`attn.hook_z`) at all positions at once, layer x head_index."""
    return activation_patch(model, clean_tokens, corrupted_tokens, metric, "head_out", ("head_index",),
                            direction=direction, layers=layers, max_batch=max_batch)


def patch_head_out_by_pos(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """Each head's output (`attn.hook_z`) at one position, layer x pos x head_index."""
    return activation_patch(model, clean_tokens, corrupted_tokens, metric, "head_out", ("pos", "head_index"),
                            direction=direction, layers=layers, max_batch=max_batch)


def patch_mlp_out(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """Each block's MLP output (`hook_mlp_out`), layer x pos."""
    return activation_patch(model, clean_tokens, corrupted_tokens, metric, "mlp_out", ("pos",),
                            direction=direction, layers=layers, max_batch=max_batch)
