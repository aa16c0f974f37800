"""Attribution patching: first-order estimates of exact patching (AtP, AtP*'s fixes, integrated gradients)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching.exact import _narrowed_last_block
from interp.patching.metrics import Metric, mean_metric
from interp.patching.sweep import (
    DEFAULT_MAX_BATCH,
    DIRECTIONS,
    PatchResult,
    _cells,
    _result,
    _Sweep,
    _validate,
    baseline_metrics,
)

QK_KINDS = ("q", "k")  # the kinds the QK fix of attribution applies to
AFTER_RESID_MID = ("resid_mid", "mlp_out", "resid_post")  # kinds read at or after a block's resid_mid


def attribution_patch(
    model: HookedTransformer,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    kind: str = "resid_pre",
    over: Sequence[str] = ("pos",),
    *,
    direction: str = "clean_to_corrupted",
    layers: Sequence[int] | None = None,
    steps: int = 1,
    qk_fix: bool = False,
    grad_drop: bool = False,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """First-order estimate of `activation_patch` with the same arguments: the target's mean
    metric plus grad(mean metric) . (source - target) summed over each cell's entries.

    steps=1 (attribution patching, AtP): one forward pass of each input and one backward pass
    of the target's, for all cells and layers (the gradient is taken at the target run, the
    point exact patching patches into). Exact where the metric is linear in the activation; it
    misses step-like effects of trained models (saturated attention or MLPs, where the
    derivative is ~0 at both ends although the patch flips the answer), so it is a screen to
    confirm with exact patching (`screen_and_verify`).

    steps=K > 1 (integrated gradients, as in EAP-IG): the gradient is averaged over K points
    (midpoints of K equal segments) of the straight line from the target's token embeddings to
    the source's, so a step anywhere along the way is seen. About K times the work of steps=1,
    run as stacked copies of the batch (`max_batch` samples per pass). Planted heads keep the
    target's token ids along the line.

    The two fixes of AtP* (Kramar et al. 2024), for steps=1:
    - qk_fix (kinds "q" and "k"): a query or key reaches the metric only through its head's
      attention softmax, which saturates. The patched attention logits are computed exactly and
      the softmax redone for each cell (a query changes its row, a key its column in every row);
      only the step from attention probabilities to the metric is linearised: the estimate is
      grad(metric wrt pattern) . (patched pattern - target pattern). Planted heads, whose pattern
      ignores q and k, get 0, as exact patching gives them.
    - grad_drop: against a direct and an indirect effect that cancel in the gradient, one more
      backward pass per layer l with the gradient through layer l's attention and MLP outputs
      zeroed (forward values unchanged). A cell in layer m gets the mean over l != m of the
      passes' |estimate|, signed as that mean's signed counterpart; use it to rank cells, not as
      an effect size.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    if qk_fix and kind not in QK_KINDS:
        raise ValueError(f"qk_fix applies to the kinds {QK_KINDS} (a head's queries and keys), not {kind!r}")
    if steps > 1 and (qk_fix or grad_drop):
        raise ValueError("qk_fix and grad_drop are options of one-step attribution (steps=1), not of integrated "
                         "gradients")
    sweep = _validate(model, clean_tokens, corrupted_tokens, kind, over, direction, layers)
    names = [sweep.activation.name(layer) for layer in sweep.layers]
    # an activation read at or after the last block's resid_mid needs every position there
    reads_last_mlp = kind in AFTER_RESID_MID and model.cfg.n_layers - 1 in sweep.layers
    final_hooks, metric = ([], metric) if reads_last_mlp else _narrowed_last_block(model, metric, queries=False)
    cells = _cells(model, sweep, clean_tokens.shape[1], clean_tokens.device)
    flat_masks = cells.masks.flatten(1).float()
    if steps > 1:
        sources, targets, grads, clean_metric, corrupted_metric = _integrated_terms(
            model, clean_tokens, corrupted_tokens, metric, names, direction, final_hooks, steps=steps,
            max_batch=max_batch)
        deltas = torch.stack([flat_masks @ (grad * (source - target)).sum(dim=(0, -1)).flatten()
                              for source, target, grad in zip(sources, targets, grads)])
    else:
        first = _FirstOrder(model, clean_tokens, corrupted_tokens, metric, sweep, final_hooks, qk_fix)
        clean_metric, corrupted_metric = first.clean_metric, first.corrupted_metric
        deltas = first.cell_deltas(flat_masks)
        if grad_drop:
            dropped = torch.stack([first.cell_deltas(flat_masks, drop_layer=cut) for cut in range(model.cfg.n_layers)])
            deltas = _grad_drop(dropped, sweep.layers, deltas)
    target_metric = corrupted_metric if direction == DIRECTIONS[0] else clean_metric
    raw = target_metric + deltas
    method = "attribution" + ("+qk-fix" if qk_fix else "") + ("+graddrop" if grad_drop else "")
    return _result(sweep, raw.view(cells.shape).cpu(), method, clean_metric, corrupted_metric)


def _grad_drop(dropped: Float[Tensor, "drop layer cell"], layers: list[int], plain: Float[Tensor, "layer cell"],
               ) -> Float[Tensor, "layer cell"]:
    """GradDrop's score per cell of layer m: the mean over passes l != m of |estimate|, with the
    sign of the mean estimate. A one-layer model has no other layer to drop: plain estimates."""
    if len(dropped) == 1:
        return plain
    combined = []
    for i, layer in enumerate(layers):
        passes = dropped[[cut for cut in range(len(dropped)) if cut != layer], i]
        sign = torch.where(passes.mean(0) < 0, -1.0, 1.0)
        combined.append(sign * passes.abs().mean(0))
    return torch.stack(combined)


class _FirstOrder:
    """One-step attribution: the source run's activations (no graph), and backward passes of the
    target run, plain or with one layer's residual contributions cut from the gradient."""

    def __init__(self, model: HookedTransformer, clean: Tensor, corrupted: Tensor, metric: Metric, sweep: _Sweep,
                 final_hooks: list[tuple[str, Any]], qk_fix: bool):
        self.model, self.metric, self.sweep, self.final_hooks, self.qk_fix = model, metric, sweep, final_hooks, qk_fix
        self.names = [sweep.activation.name(layer) for layer in sweep.layers]
        clean_source = sweep.direction == DIRECTIONS[0]  # clean activations patched into the corrupted run
        source_tokens, self.target_tokens = (clean, corrupted) if clean_source else (corrupted, clean)
        # with the QK fix, the source's query (key) after rotary is what the patched logits read
        self.source_names = [self._qk_name(layer, sweep.kind) for layer in sweep.layers] if qk_fix else self.names
        with torch.no_grad(), model.hooks(fwd_hooks=final_hooks):
            source_logits, cache = model.run_with_cache(source_tokens, names_filter=lambda h: h in self.source_names)
        self.source = [cache[name] for name in self.source_names]
        target_logits, self.target, self.grads = self._backward(drop_layer=None)
        clean_logits, corrupted_logits = (source_logits, target_logits)[:: 1 if clean_source else -1]
        self.clean_metric, self.corrupted_metric = baseline_metrics(metric, torch.cat([clean_logits, corrupted_logits]),
                                                              clean.shape[0])

    def _qk_name(self, layer: int, kind: str) -> str:
        rotary = self.model.cfg.positional_embedding_type == "rotary"
        return f"blocks.{layer}.attn.hook_{'rot_' if rotary else ''}{kind}"

    def _backward(self, drop_layer: int | None) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """The target's logits, its activations at the hooks the estimate reads, and the
        gradients of the mean metric there (at the attention pattern, with the QK fix)."""
        layers = self.sweep.layers
        if self.qk_fix:
            values = [self._qk_name(layer, "q") for layer in layers] + [self._qk_name(layer, "k") for layer in layers] \
                + [f"blocks.{layer}.attn.hook_attn_scores" for layer in layers]
            wrt = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
        else:
            values, wrt = [], self.names
        saved: dict[str, Tensor] = {}

        def save(act: Tensor, hook: Any) -> Tensor:
            saved[hook.name] = act
            return act

        # a leaf that needs grad at the embedding keeps every activation in the graph even when the
        # caller froze the parameters; no parameter gradient is computed (autograd.grad below)
        hooks = [("hook_embed", lambda act, hook: act.detach().requires_grad_(True))]
        hooks += [(name, save) for name in [*values, *wrt]]
        if drop_layer is not None:  # GradDrop: same forward values, no gradient through layer l's outputs
            hooks += [(f"blocks.{drop_layer}.hook_{part}_out", lambda act, hook: act.detach())
                      for part in ("attn", "mlp")]
        with torch.enable_grad(), self.model.hooks(fwd_hooks=hooks + self.final_hooks):
            logits = self.model(self.target_tokens)
            grads = torch.autograd.grad(mean_metric(self.metric, logits), [saved[n] for n in wrt], allow_unused=True)
        grads = {n: torch.zeros_like(saved[n]) if g is None else g for n, g in zip(wrt, grads)}
        return logits.detach(), {n: a.detach() for n, a in saved.items()}, grads

    def cell_deltas(self, flat_masks: Tensor, drop_layer: int | None = None) -> Float[Tensor, "layer cell"]:
        """Each cell's estimated change of the mean metric, per swept layer."""
        grads = self.grads if drop_layer is None else self._backward(drop_layer)[2]
        deltas = []
        for i, layer in enumerate(self.sweep.layers):
            if self.qk_fix:
                per_entry = self._qk_fixed(layer, self.source[i], grads[f"blocks.{layer}.attn.hook_pattern"])
            else:
                name = self.names[i]
                per_entry = (grads[name] * (self.source[i] - self.target[name])).sum(dim=(0, -1))  # [pos (head_index)]
            deltas.append(flat_masks @ per_entry.flatten().float())
        return torch.stack(deltas)

    def _qk_fixed(self, layer: int, source: Tensor, grad_pattern: Tensor) -> Float[Tensor, "pos head_index"]:
        """Per (position, head): grad . (softmax of the logits with that query or key patched
        - the target's pattern), summed over the batch."""
        attn = self.model.blocks[layer].attn
        q = self.target[self._qk_name(layer, "q")].transpose(1, 2)  # [batch head pos d_head]
        k = self.target[self._qk_name(layer, "k")].transpose(1, 2)
        scores = self.target[f"blocks.{layer}.attn.hook_attn_scores"]  # [batch head query key]
        pattern = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        if self.sweep.kind == "q":  # query t's row: every logit of it moves
            shift = (source.transpose(1, 2) - q) @ k.transpose(-1, -2) / attn.attn_scale
            patched = torch.softmax(scores + shift, dim=-1).nan_to_num(0.0)
            per_entry = (grad_pattern * (patched - pattern)).sum(-1).sum(0)  # [head query]
        else:  # key s: logit [t, s] of every row t moves
            shift = q @ (source.transpose(1, 2) - k).transpose(-1, -2) / attn.attn_scale  # [batch head query key]
            n_pos = scores.shape[-1]
            per_entry = torch.zeros(scores.shape[1], n_pos, device=scores.device, dtype=scores.dtype)
            chunk = max(1, 2**24 // scores.numel())  # keys per pass: about 16 M entries of [batch head query key]
            for keys in torch.arange(n_pos, device=scores.device).split(chunk):
                one_hot = torch.nn.functional.one_hot(keys, n_pos).to(scores.dtype)  # [c key]
                moved = scores.unsqueeze(-2) + shift[..., keys].unsqueeze(-1) * one_hot  # [batch head query c key]
                patched = torch.softmax(moved, dim=-1).nan_to_num(0.0)
                # [batch head query c]
                change = (grad_pattern.unsqueeze(-2) * (patched - pattern.unsqueeze(-2))).sum(-1)
                per_entry[:, keys] = change.sum(dim=(0, 2))
        per_entry = per_entry.clone()
        for head in getattr(self.model, "planted_plan", {}).get(layer, {}):
            per_entry[head] = 0.0  # a planted pattern does not read q or k
        return per_entry.T


def _integrated_terms(
    model: HookedTransformer, clean: Tensor, corrupted: Tensor, metric: Metric, names: list[str], direction: str,
    final_hooks: list[tuple[str, Any]], *, steps: int, max_batch: int,
) -> tuple[list[Tensor], list[Tensor], list[Tensor], float, float]:
    """The terms of one-step attribution (source and target activations, gradients at the
    target, both baselines), with each gradient averaged over `steps` points of the line from
    the target's token embeddings to the source's (integrated gradients, midpoint rule)."""
    source_tokens, target_tokens = (clean, corrupted) if direction == DIRECTIONS[0] else (corrupted, clean)
    n = clean.shape[0]
    keep = set(names) | {"hook_embed"}
    with torch.no_grad(), model.hooks(fwd_hooks=final_hooks):
        source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda h: h in keep)
        target_logits, target_cache = model.run_with_cache(target_tokens, names_filter=lambda h: h in keep)
    start, step = target_cache["hook_embed"], source_cache["hook_embed"] - target_cache["hook_embed"]
    alphas = (torch.arange(steps, dtype=start.dtype, device=start.device) + 0.5) / steps
    totals = [torch.zeros_like(target_cache[name]) for name in names]
    per_pass = max(1, max_batch // n)  # line points per stacked pass
    saved: dict[str, Tensor] = {}

    def save(act: Tensor, hook: Any) -> Tensor:
        saved[hook.name] = act
        return act

    for chunk in alphas.split(per_pass):
        embedded = (start + chunk.view(-1, 1, 1, 1) * step).flatten(0, 1)  # [len(chunk) * n, pos, d_model]
        hooks = [("hook_embed", lambda act, hook, e=embedded: e.detach().requires_grad_(True))]
        hooks += [(name, save) for name in names] + final_hooks
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(target_tokens.repeat(len(chunk), 1))
            # the mean over the line and the pairs: each chunk carries its share of the line
            objective = sum(mean_metric(metric, part) for part in logits.split(n)) / steps
            grads = torch.autograd.grad(objective, [saved[name] for name in names], allow_unused=True)
        for total, grad in zip(totals, grads):
            if grad is not None:
                total += grad.view(len(chunk), n, *grad.shape[1:]).sum(0)
    clean_logits, corrupted_logits = (source_logits, target_logits)[:: 1 if direction == DIRECTIONS[0] else -1]
    clean_metric, corrupted_metric = baseline_metrics(metric, torch.cat([clean_logits, corrupted_logits]), n)
    return ([source_cache[name] for name in names], [target_cache[name] for name in names], totals,
            clean_metric, corrupted_metric)


def attribute_residual(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None, steps: int = 1,
) -> PatchResult:
    """Attribution estimate of `patch_residual`: layer x pos."""
    return attribution_patch(model, clean_tokens, corrupted_tokens, metric, "resid_pre", ("pos",),
                             direction=direction, layers=layers, steps=steps)


def attribute_head_out(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None, steps: int = 1,
) -> PatchResult:
    """Attribution estimate of `patch_head_out`: layer x head_index."""
    return attribution_patch(model, clean_tokens, corrupted_tokens, metric, "head_out", ("head_index",),
                             direction=direction, layers=layers, steps=steps)


def attribute_head_out_by_pos(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, direction: str = "clean_to_corrupted", layers: Sequence[int] | None = None, steps: int = 1,
) -> PatchResult:
    """Attribution estimate of `patch_head_out_by_pos`: layer x pos x head_index."""
    return attribution_patch(model, clean_tokens, corrupted_tokens, metric, "head_out", ("pos", "head_index"),
                             direction=direction, layers=layers, steps=steps)
