"""What a sweep is: the patchable activations, a validated request, its cells and its labelled result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching.metrics import Metric, mean_metric, normalise

DIRECTIONS = ("clean_to_corrupted", "corrupted_to_clean")
DEFAULT_MAX_BATCH = 128  # samples per stacked forward pass; on CPU larger batches are no faster per sample


@dataclass(frozen=True)
class Activation:
    """A patchable activation: its hook name per layer, its axes between batch and features, and
    whether a patch at one position changes its block's output only at that position (true
    after the block's attention has mixed positions, false for the block's input)."""

    hook: str
    axes: tuple[str, ...]
    local: bool = True

    def name(self, layer: int) -> str:
        return self.hook.format(layer=layer)


ACTIVATIONS: dict[str, Activation] = {
    "resid_pre": Activation("blocks.{layer}.hook_resid_pre", ("pos",), local=False),
    "resid_mid": Activation("blocks.{layer}.hook_resid_mid", ("pos",)),
    "resid_post": Activation("blocks.{layer}.hook_resid_post", ("pos",)),
    "attn_out": Activation("blocks.{layer}.hook_attn_out", ("pos",)),
    "mlp_out": Activation("blocks.{layer}.hook_mlp_out", ("pos",)),
    "head_out": Activation("blocks.{layer}.attn.hook_z", ("pos", "head_index")),  # before W_O
    # a head's query at one position changes that position's attention row only; its key at one
    # position changes every row's softmax, so every position of the block's output
    "q": Activation("blocks.{layer}.attn.hook_q", ("pos", "head_index")),
    "k": Activation("blocks.{layer}.attn.hook_k", ("pos", "head_index"), local=False),
}


@dataclass
class PatchResult:
    """One patching sweep, labelled for heatmaps and JSON.

    values: normalised, 0 = corrupted behaviour, 1 = clean; `raw` is the metric's mean over the
    pairs per cell, in the metric's units (logits for a logit difference). Axis 0 runs over
    `layers`; the other axes are named in `axes`.
    """

    values: Float[Tensor, "layer ..."]
    raw: Float[Tensor, "layer ..."]
    axes: tuple[str, ...]
    layers: list[int]
    activation: str  # a key of ACTIVATIONS
    hook: str  # the hook name template, e.g. "blocks.{layer}.attn.hook_z"
    direction: str
    method: str  # "exact" or "attribution"
    clean_metric: float
    corrupted_metric: float

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers, for `json.dumps`."""
        return {
            "values": self.values.tolist(), "raw": self.raw.tolist(), "axes": list(self.axes),
            "layers": self.layers, "activation": self.activation, "hook": self.hook,
            "direction": self.direction, "method": self.method,
            "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
        }


@dataclass(frozen=True)
class _Sweep:
    """A validated request: what to patch, over which axes and layers, in which direction."""

    kind: str
    activation: Activation
    over: tuple[str, ...]
    layers: list[int]
    direction: str


def _validate(
    model: HookedTransformer, clean: Tensor, corrupted: Tensor, kind: str, over: Sequence[str],
    direction: str, layers: Sequence[int] | None, max_batch: int = 1,
) -> _Sweep:
    if clean.dim() != 2 or clean.shape != corrupted.shape:
        raise ValueError(f"clean_tokens {tuple(clean.shape)} and corrupted_tokens {tuple(corrupted.shape)} must both "
                         "be [batch pos] with the same shape (counterfactual pairs, one row each)")
    if kind not in ACTIVATIONS:
        raise ValueError(f"activation kind {kind!r} is unknown; use one of {sorted(ACTIVATIONS)}")
    activation = ACTIVATIONS[kind]
    over = (over,) if isinstance(over, str) else tuple(over)
    if any(axis not in activation.axes for axis in over) or len(set(over)) != len(over):
        raise ValueError(f"over={over} for {kind!r}: sweep over distinct axes among {activation.axes} (or none)")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is unknown; use one of {DIRECTIONS}")
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if layers is None else list(layers)
    if not layers or any(not 0 <= layer < n_layers for layer in layers):
        raise ValueError(f"layers={layers} must be a non-empty list within 0..{n_layers - 1}")
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch} must be >= 1 (samples per stacked run; at least one copy runs)")
    return _Sweep(kind, activation, over, layers, direction)


def cell_masks(
    axes: Sequence[str], over: Sequence[str], sizes: dict[str, int]
) -> Bool[Tensor, "cell ..."]:
    """For each cell (one index per axis in `over`, row-major), which entries of a per-sample
    activation with `axes` it covers; axes not in `over` are patched whole."""
    mask = torch.ones(*[sizes[a] for a in over], *[sizes[a] for a in axes], dtype=torch.bool)
    for i, axis in enumerate(over):
        shape = [1] * mask.dim()
        shape[i] = shape[len(over) + axes.index(axis)] = sizes[axis]
        mask = mask & torch.eye(sizes[axis], dtype=torch.bool).view(shape)
    return mask.reshape(-1, *mask.shape[len(over):])


@dataclass(frozen=True)
class _Cells:
    """The cells of one layer, and how to patch many of them with one run of the block.

    groups: unions of cells that touch disjoint positions (cells that differ only in their
    position), so one run of the block per group patches them all; group_of: each cell's group;
    positions: which positions of the block's output a cell changes.
    """

    shape: tuple[int, ...]
    masks: Bool[Tensor, "cell pos ..."]
    groups: Bool[Tensor, "group pos ..."]
    group_of: Int[Tensor, " cell"]
    positions: Bool[Tensor, "cell pos"]


def _cells(model: HookedTransformer, sweep: _Sweep, n_pos: int, device: torch.device) -> _Cells:
    sizes = {"pos": n_pos, "head_index": model.cfg.n_heads}
    over_sizes = [sizes[a] for a in sweep.over]
    masks = cell_masks(sweep.activation.axes, sweep.over, sizes)
    positions = masks.reshape(len(masks), n_pos, -1).any(-1)
    if "pos" in sweep.over:
        i = sweep.over.index("pos")
        groups = masks.view(*over_sizes, *masks.shape[1:]).any(dim=i).reshape(-1, *masks.shape[1:])
        others = over_sizes[:i] + over_sizes[i + 1:]
        group_of = torch.arange(len(groups)).view(others).unsqueeze(i).expand(over_sizes).flatten()
    else:
        groups, group_of = masks, torch.arange(len(masks))
    return _Cells((len(sweep.layers), *over_sizes), masks.to(device), groups.to(device), group_of.to(device),
                  positions.to(device))


def _result(sweep: _Sweep, raw: Tensor, method: str, clean_metric: float, corrupted_metric: float) -> PatchResult:
    return PatchResult(
        normalise(raw, clean_metric, corrupted_metric), raw, ("layer", *sweep.over), sweep.layers, sweep.kind,
        sweep.activation.hook, sweep.direction, method, clean_metric, corrupted_metric,
    )


def baseline_metrics(metric: Metric, logits: Tensor, n: int) -> tuple[float, float]:
    """Mean metric of the clean half and the corrupted half of a stacked [clean; corrupted] run."""
    clean_metric, corrupted_metric = mean_metric(metric, logits[:n]).item(), mean_metric(metric, logits[n:]).item()
    if clean_metric == corrupted_metric:
        raise ValueError(f"clean and corrupted runs give the same metric ({clean_metric}), so nothing can be "
                         "normalised; use pairs and a metric on which the corruption changes the output")
    return clean_metric, corrupted_metric


def source_target_slices(direction: str, n: int) -> tuple[slice, slice]:
    """Where source and target sit in a stacked [clean; corrupted] batch of 2n."""
    clean, corrupted = slice(0, n), slice(n, 2 * n)
    return (clean, corrupted) if direction == DIRECTIONS[0] else (corrupted, clean)
