"""Screening: estimate every cell, verify the most promising exactly (AtP*'s protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching.attribution import attribution_patch
from interp.patching.exact import _exact_cells
from interp.patching.metrics import Metric, normalise
from interp.patching.sweep import DEFAULT_MAX_BATCH, DIRECTIONS, PatchResult, _Cells, _cells, _validate


def effect_sizes(result: PatchResult) -> Float[Tensor, "layer ..."]:
    """|metric - the target run's metric| per cell: how far patching the cell moves the metric,
    whichever way (the size exact patching ranks by, and the one a screen ranks by)."""
    target = result.corrupted_metric if result.direction == DIRECTIONS[0] else result.clean_metric
    return (result.raw - target).abs()


def verification_cost(estimate: PatchResult, exact: PatchResult, k: int = 3) -> int:
    """How many cells must be verified, in the estimate's order (largest effect first), before
    all of exact patching's top `k` cells (by |effect|) are among them: the yardstick of AtP*
    (Kramar et al. 2024). Divide by the number of cells for the fraction of the exact sweep.
    Cells whose exact effect is nil (below 1e-6 of the largest) are never among the top k: when
    fewer than k cells do anything, those few are the ones to find."""
    if estimate.raw.shape != exact.raw.shape:
        raise ValueError(f"estimate {tuple(estimate.raw.shape)} and exact {tuple(exact.raw.shape)} cover different "
                         "cells")
    sizes = effect_sizes(estimate).flatten()
    if not sizes.isfinite().all():
        raise ValueError("the estimate holds a non-finite value; no order of verification can be read from it")
    if not 1 <= k <= sizes.numel():
        raise ValueError(f"k={k} must be within 1..{sizes.numel()} (the number of cells)")
    order = sizes.argsort(descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    truth = effect_sizes(exact).flatten()
    top = truth.topk(k)
    wanted = top.indices[top.values > 1e-6 * truth.max()]
    if len(wanted) == 0:
        raise ValueError("no cell of the exact sweep changes the metric; there is nothing to find")
    return int(rank[wanted].max()) + 1


@dataclass
class Screened:
    """A screen's estimate of every cell, and exact patching of the `budget` cells it ranked
    first. `cells` are (layer, index along each axis of `over`) in the estimate's order; `values`
    and `raw` are their exact effects, normalised and in the metric's units."""

    estimate: PatchResult
    cells: list[tuple[int, ...]]
    values: Float[Tensor, " verified"]
    raw: Float[Tensor, " verified"]

    def strongest(self, n: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The verified cells with the largest exact |effect|, with their normalised value."""
        estimate = self.estimate
        target = estimate.corrupted_metric if estimate.direction == DIRECTIONS[0] else estimate.clean_metric
        order = (self.raw - target).abs().argsort(descending=True, stable=True)[:n]
        return [(self.cells[i], self.values[i].item()) for i in order.tolist()]

    def to_dict(self) -> dict[str, Any]:
        return {"estimate_method": self.estimate.method, "axes": list(self.estimate.axes),
                "cells": [list(c) for c in self.cells], "values": self.values.tolist(), "raw": self.raw.tolist()}


def screen_and_verify(
    model: HookedTransformer,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    kind: str = "head_out",
    over: Sequence[str] = ("pos", "head_index"),
    budget: int = 16,
    *,
    direction: str = "clean_to_corrupted",
    layers: Sequence[int] | None = None,
    steps: int = 1,
    qk_fix: bool = False,
    grad_drop: bool = False,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> Screened:
    """Rank every cell by `attribution_patch` (with the given options), then patch the first
    `budget` cells exactly: verified effects for the cells most likely to matter, at a fraction
    of the exact sweep's cost. `verification_cost` on a model where the full sweep was run says
    how large a budget a screen needs."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget={budget!r} must be an integer >= 1 (cells to verify)")
    estimate = attribution_patch(model, clean_tokens, corrupted_tokens, metric, kind, over, direction=direction,
                                 layers=layers, steps=steps, qk_fix=qk_fix, grad_drop=grad_drop, max_batch=max_batch)
    sweep = _validate(model, clean_tokens, corrupted_tokens, kind, over, direction, layers, max_batch)
    cells = _cells(model, sweep, clean_tokens.shape[1], clean_tokens.device)
    chosen = effect_sizes(estimate).flatten().argsort(descending=True, stable=True)[:budget].to(cells.masks.device)
    layer_index, cell = chosen // len(cells.masks), chosen % len(cells.masks)  # flat index = layer x cell
    per_layer: list[_Cells | None] = []
    for i in range(len(sweep.layers)):
        mine = cell[layer_index == i]  # in the estimate's order, as `raw` is filled below
        per_layer.append(None if len(mine) == 0 else _Cells(
            cells.shape, cells.masks[mine], cells.masks[mine], torch.arange(len(mine), device=mine.device),
            cells.positions[mine]))
    raw_by_layer, clean_metric, corrupted_metric = _exact_cells(model, clean_tokens, corrupted_tokens, metric, sweep,
                                                               per_layer, max_batch)
    raw = torch.empty(len(chosen))
    for i, values in enumerate(raw_by_layer):
        raw[(layer_index == i).cpu()] = values.cpu()
    # axis 0 of a cell's index is a position in `layers`: report the layer itself
    index = torch.stack(torch.unravel_index(chosen.cpu(), cells.shape), dim=1).tolist()
    named = [(sweep.layers[i[0]], *i[1:]) for i in index]
    return Screened(estimate, named, normalise(raw, clean_metric, corrupted_metric), raw)
