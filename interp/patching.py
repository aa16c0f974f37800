"""Activation patching between counterfactual pairs: exact, and its first-order estimate.

A *clean* input shows the behaviour a metric reads; its *corrupted* twin (a task's `corrupt()`)
differs in one generative variable. Patching copies one *cell* of activation (a head's output,
the residual stream at one position ...) from a *source* run into a *target* run:

    clean_to_corrupted  run the corrupted input, copy in clean activations ("denoising", the
                        TransformerLens convention): which cells suffice to restore the behaviour
    corrupted_to_clean  run the clean input, copy in corrupted activations ("noising"): which
                        cells the behaviour needs

Both directions are normalised alike, (m - m_corrupted) / (m_clean - m_corrupted), where m is
the metric's mean over the pairs: 0 is corrupted behaviour, 1 is clean.

Exact patching is batched and recomputes nothing it does not have to. One forward pass caches
both runs. For each layer l, one copy of the target batch per cell is stacked into a large
batch (chunked to `max_batch` samples) that starts from the target's cached residual stream
(`start_at_layer`), never rerunning blocks before l. A residual-stream cell at block l's input
is swapped in by a hook in block l. A cell inside block l (a head's output, the MLP's output)
changes block l's output only at the cell's positions, so block l runs once per group of cells
that differ only in position, and each cell's copy starts at block l+1 from the target's
residual stream with the cell's positions taken from its group's run.

Attribution patching estimates every cell from one forward and one backward pass:
grad(metric) . (source - target), summed over the cell's entries.

Shape glossary: batch = counterfactual pairs, pos = token positions, layer, head_index,
d_model / d_head = the feature axis of an activation, d_vocab_out = output classes,
cell = one patched piece of one layer's activation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from models.planted import token_context
from tasks import Batch

Metric = Callable[[Float[Tensor, "batch pos d_vocab_out"]], Float[Tensor, " batch"]]
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
}
AFTER_RESID_MID = ("resid_mid", "mlp_out", "resid_post")  # kinds read at or after a block's resid_mid


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


# ---------------------------------------------------------------------------------------------
# Metric


@dataclass(frozen=True)
class LogitDiff:
    """Per pair: logit of the clean label minus logit of the corrupted label, at the label's
    position. Positive when the model prefers the clean answer."""

    pos: Int[Tensor, " batch"]
    clean_label: Int[Tensor, " batch"]
    corrupted_label: Int[Tensor, " batch"]

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab_out"]) -> Float[Tensor, " batch"]:
        if logits.shape[0] != len(self.pos):
            raise ValueError(f"the metric was built for {len(self.pos)} pairs but got logits for {logits.shape[0]}")
        rows = torch.arange(len(self.pos), device=logits.device)
        at_label = logits[rows, self.pos.to(logits.device)]  # [batch d_vocab_out]
        return at_label[rows, self.clean_label.to(logits.device)] - at_label[rows, self.corrupted_label.to(logits.device)]


def logit_diff_metric(clean: Batch, corrupted: Batch, label_index: int = 0) -> LogitDiff:
    """The default metric: logit difference at label slot `label_index` (LEGO: the variable at
    that chain depth; composite: slot 0, the last position). Every pair's label there must
    exist and differ between clean and corrupted, else the metric would read nothing."""
    n_slots = clean.labels.shape[1]
    if not 0 <= label_index < n_slots:
        raise ValueError(f"label_index={label_index} is outside 0..{n_slots - 1} (the batch's label slots)")
    if clean.labels.shape != corrupted.labels.shape:
        raise ValueError(f"clean labels {tuple(clean.labels.shape)} and corrupted labels "
                         f"{tuple(corrupted.labels.shape)} differ in shape; pass a batch and its corrupt() twin")
    pos = clean.label_pos[:, label_index]
    if not torch.equal(pos, corrupted.label_pos[:, label_index]):
        raise ValueError(f"label slot {label_index} sits at different positions in clean and corrupted; "
                         "pass a batch and its corrupt() twin")
    padding = int((~clean.label_mask[:, label_index]).sum())
    if padding:
        raise ValueError(f"label slot {label_index} is padding in {padding} of {len(clean)} pairs; "
                         f"keep pairs with batch.select(batch.label_mask[:, {label_index}])")
    same = int((clean.labels[:, label_index] == corrupted.labels[:, label_index]).sum())
    if same:
        raise ValueError(f"the corruption leaves label slot {label_index} unchanged in {same} of {len(clean)} pairs; "
                         "use a slot the corruption changes (LEGO: label_index >= depth) or select the changed pairs")
    return LogitDiff(pos, clean.labels[:, label_index], corrupted.labels[:, label_index])


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two sweeps' values over the same cells (e.g. attribution
    against exact): the Pearson correlation of their tie-averaged ranks. NaN when either is
    constant or holds a non-finite value (a diverged run must not get a plausible number)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot correlate sweeps of shapes {tuple(a.shape)} and {tuple(b.shape)}; use the same cells")
    if not (a.isfinite().all() and b.isfinite().all()):
        return float("nan")
    ranks = torch.stack([_average_ranks(a.flatten()), _average_ranks(b.flatten())])
    return torch.corrcoef(ranks)[0, 1].item()


def _average_ranks(x: Tensor) -> Tensor:
    """1-based ranks of a flat tensor; tied values share their mean rank."""
    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    return (ends - (counts.double() - 1) / 2)[inverse]


def normalise(
    raw: Float[Tensor, "..."], clean_metric: float, corrupted_metric: float
) -> Float[Tensor, "..."]:
    """(m - m_corrupted) / (m_clean - m_corrupted): 0 = corrupted behaviour, 1 = clean."""
    return (raw - corrupted_metric) / (clean_metric - corrupted_metric)


def _mean_metric(metric: Metric, logits: Tensor) -> Tensor:
    values = metric(logits)
    if values.shape != (logits.shape[0],):
        raise ValueError(f"the metric returned shape {tuple(values.shape)}; it must return one value per pair, "
                         f"shape ({logits.shape[0]},) (patching averages it; do not reduce inside the metric)")
    return values.mean()


# ---------------------------------------------------------------------------------------------
# Validation and cells


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
        raise ValueError(f"clean_tokens {tuple(clean.shape)} and corrupted_tokens {tuple(corrupted.shape)} must both be "
                         "[batch pos] with the same shape (counterfactual pairs, one row each)")
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


def _baselines(metric: Metric, logits: Tensor, n: int) -> tuple[float, float]:
    """Mean metric of the clean half and the corrupted half of a stacked [clean; corrupted] run."""
    clean_metric, corrupted_metric = _mean_metric(metric, logits[:n]).item(), _mean_metric(metric, logits[n:]).item()
    if clean_metric == corrupted_metric:
        raise ValueError(f"clean and corrupted runs give the same metric ({clean_metric}), so nothing can be "
                         "normalised; use pairs and a metric on which the corruption changes the output")
    return clean_metric, corrupted_metric


def _source_target(direction: str, n: int) -> tuple[slice, slice]:
    """Where source and target sit in a stacked [clean; corrupted] batch of 2n."""
    clean, corrupted = slice(0, n), slice(n, 2 * n)
    return (clean, corrupted) if direction == DIRECTIONS[0] else (corrupted, clean)


# ---------------------------------------------------------------------------------------------
# Exact patching


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
    n, n_pos = clean_tokens.shape
    pre, post = ACTIVATIONS["resid_pre"], ACTIVATIONS["resid_post"]
    keep = {a.name(layer) for layer in sweep.layers for a in (pre, post, sweep.activation)}
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]), names_filter=lambda h: h in keep)
    target_tokens = corrupted_tokens if direction == DIRECTIONS[0] else clean_tokens
    clean_metric, corrupted_metric = _baselines(metric, logits, n)
    source, target = _source_target(direction, n)
    cells = _cells(model, sweep, n_pos, clean_tokens.device)
    with token_context(model, target_tokens):  # planted heads: the runs below start from a residual stream
        raw = torch.stack([
            _sweep_layer(model, layer, sweep.activation, cache[pre.name(layer)][target], cache[post.name(layer)][target],
                         cache[sweep.activation.name(layer)][source], cells, metric, max_batch)
            for layer in sweep.layers
        ])
    return _result(sweep, raw.view(cells.shape).cpu(), "exact", clean_metric, corrupted_metric)


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
    return torch.stack([_mean_metric(metric, copy) for logits in outputs for copy in logits])


def _narrowed_last_block(model: HookedTransformer, metric: Metric) -> tuple[list[tuple[str, Any]], Metric]:
    """When the metric reads the logits at one known position per pair (`LogitDiff`), the last
    block's MLP, the final norm and the unembedding need to run there only: a hook keeps just
    those rows of the last block's resid_mid (its attention still sees every position), and the
    returned metric reads position 0 of the narrowed logits. Other metrics and architectures
    (parallel or no MLP, post-norm) run in full: ([], metric)."""
    cfg = model.cfg
    if not isinstance(metric, LogitDiff) or cfg.attn_only or cfg.parallel_attn_mlp \
            or not hasattr(model.blocks[-1], "hook_resid_mid") or getattr(model.blocks[-1], "ln2", None) is None:
        return [], metric
    positions = metric.pos

    def keep_label_rows(resid_mid: Tensor, hook: Any) -> Tensor:
        rows = positions.to(resid_mid.device).repeat(resid_mid.shape[0] // len(positions))
        return resid_mid[torch.arange(len(rows), device=resid_mid.device), rows].unsqueeze(1)  # [batch 1 d_model]

    at_zero = LogitDiff(torch.zeros_like(positions), metric.clean_label, metric.corrupted_label)
    return [(f"blocks.{cfg.n_layers - 1}.hook_resid_mid", keep_label_rows)], at_zero


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
            out = model(resid_pre.repeat(len(chunk), 1, 1), start_at_layer=layer, stop_at_layer=stop_at_layer)
        yield out.view(len(chunk), n, *out.shape[1:])


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
            logits = model(resid.flatten(0, 1), start_at_layer=layer + 1)
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


# ---------------------------------------------------------------------------------------------
# Attribution patching


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
    max_batch: int = DEFAULT_MAX_BATCH,
) -> PatchResult:
    """First-order estimate of `activation_patch` with the same arguments: the target's mean
    metric plus grad(mean metric) . (source - target) summed over each cell's entries.

    steps=1 (attribution patching, AtP): one forward pass of each input and one backward pass
    of the target's, for all cells and layers (the gradient is taken at the target run, the
    point exact patching patches into). Exact where the metric is linear in the activation; it
    misses step-like effects of trained models (saturated attention or MLPs, where the
    derivative is ~0 at both ends although the patch flips the answer), so it is a screen to
    confirm with exact patching.

    steps=K > 1 (integrated gradients, as in EAP-IG): the gradient is averaged over K points
    (midpoints of K equal segments) of the straight line from the target's token embeddings to
    the source's, so a step anywhere along the way is seen. About K times the work of steps=1,
    run as stacked copies of the batch (`max_batch` samples per pass). Planted heads keep the
    target's token ids along the line.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    sweep = _validate(model, clean_tokens, corrupted_tokens, kind, over, direction, layers)
    names = [sweep.activation.name(layer) for layer in sweep.layers]
    # an activation read at or after the last block's resid_mid needs every position there
    reads_last_mlp = kind in AFTER_RESID_MID and model.cfg.n_layers - 1 in sweep.layers
    final_hooks, metric = ([], metric) if reads_last_mlp else _narrowed_last_block(model, metric)
    terms = _first_order_terms if steps == 1 else partial(_integrated_terms, steps=steps, max_batch=max_batch)
    sources, targets, grads, clean_metric, corrupted_metric = terms(
        model, clean_tokens, corrupted_tokens, metric, names, direction, final_hooks)
    cells = _cells(model, sweep, clean_tokens.shape[1], clean_tokens.device)
    flat_masks = cells.masks.flatten(1).to(grads[0].dtype)
    target_metric = corrupted_metric if direction == DIRECTIONS[0] else clean_metric
    deltas = []
    for source, target, grad in zip(sources, targets, grads):
        per_entry = (grad * (source - target)).sum(dim=(0, -1))  # [pos (head_index)]
        deltas.append(flat_masks @ per_entry.flatten())
    raw = target_metric + torch.stack(deltas)
    return _result(sweep, raw.view(cells.shape).cpu(), "attribution", clean_metric, corrupted_metric)


def _first_order_terms(
    model: HookedTransformer, clean: Tensor, corrupted: Tensor, metric: Metric, names: list[str], direction: str,
    final_hooks: list[tuple[str, Any]],
) -> tuple[list[Tensor], list[Tensor], list[Tensor], float, float]:
    """Source and target activations at `names`, the gradients of the target's mean metric with
    respect to the target's, and both baselines.

    Each input runs forward once, as in the stacked [clean; corrupted] run that exact patching
    caches, but only the target run records a graph, so the one backward pass covers the n
    target samples instead of all 2n (the source half would only receive zero gradients).
    """
    source_tokens, target_tokens = (clean, corrupted) if direction == DIRECTIONS[0] else (corrupted, clean)
    with torch.no_grad(), model.hooks(fwd_hooks=final_hooks):
        source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda h: h in names)
    saved: dict[str, Tensor] = {}

    def save(act: Tensor, hook: Any) -> Tensor:
        saved[hook.name] = act
        return act

    # a leaf that needs grad at the embedding keeps every activation in the graph even when the
    # caller froze the parameters; no parameter gradient is computed (autograd.grad below)
    hooks = [("hook_embed", lambda act, hook: act.detach().requires_grad_(True))]
    hooks += [(name, save) for name in names] + final_hooks
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        target_logits = model(target_tokens)
        target_acts = [saved[name] for name in names]
        grads = torch.autograd.grad(_mean_metric(metric, target_logits), target_acts, allow_unused=True)
    grads = [torch.zeros_like(a) if g is None else g for a, g in zip(target_acts, grads)]
    clean_logits, corrupted_logits = (source_logits, target_logits.detach())[:: 1 if direction == DIRECTIONS[0] else -1]
    clean_metric, corrupted_metric = _baselines(metric, torch.cat([clean_logits, corrupted_logits]), clean.shape[0])
    source_acts = [source_cache[name] for name in names]
    return source_acts, [a.detach() for a in target_acts], grads, clean_metric, corrupted_metric


def _integrated_terms(
    model: HookedTransformer, clean: Tensor, corrupted: Tensor, metric: Metric, names: list[str], direction: str,
    final_hooks: list[tuple[str, Any]], *, steps: int, max_batch: int,
) -> tuple[list[Tensor], list[Tensor], list[Tensor], float, float]:
    """As `_first_order_terms`, with each gradient averaged over `steps` points of the line from
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
            objective = sum(_mean_metric(metric, part) for part in logits.split(n)) / steps
            grads = torch.autograd.grad(objective, [saved[name] for name in names], allow_unused=True)
        for total, grad in zip(totals, grads):
            if grad is not None:
                total += grad.view(len(chunk), n, *grad.shape[1:]).sum(0)
    clean_logits, corrupted_logits = (source_logits, target_logits)[:: 1 if direction == DIRECTIONS[0] else -1]
    clean_metric, corrupted_metric = _baselines(metric, torch.cat([clean_logits, corrupted_logits]), n)
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
