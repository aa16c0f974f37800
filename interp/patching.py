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
from transformer_lens.hook_points import HookPoint

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
    # a head's query at one position changes that position's attention row only; its key at one
    # position changes every row's softmax, so every position of the block's output
    "q": Activation("blocks.{layer}.attn.hook_q", ("pos", "head_index")),
    "k": Activation("blocks.{layer}.attn.hook_k", ("pos", "head_index"), local=False),
}
QK_KINDS = ("q", "k")  # the kinds the QK fix of attribution applies to
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
    """The default metric: logit difference at label slot `label_index` (one slot per variable in a
    task with several labels; slot 0, the last position, in a task with one). Every pair's label there must
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
                         f"shape ({logits.shape[0]},) (patching averages it; do not reduce inside the metric). A "
                         f"TransformerLens-style metric that returns one number: wrap it, "
                         f"interp.outside.scalar_metric(fn) (docs/outside-models.md)")
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
    clean_metric, corrupted_metric = _baselines(metric, logits, n)
    source, target = _source_target(sweep.direction, n)
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
    return torch.stack([_mean_metric(metric, copy) for logits in outputs for copy in logits])


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


def forward_from(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"], layer: int, **kwargs: Any) -> Tensor:
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
        raise ValueError("qk_fix and grad_drop are options of one-step attribution (steps=1), not of integrated gradients")
    sweep = _validate(model, clean_tokens, corrupted_tokens, kind, over, direction, layers)
    names = [sweep.activation.name(layer) for layer in sweep.layers]
    # an activation read at or after the last block's resid_mid needs every position there
    reads_last_mlp = kind in AFTER_RESID_MID and model.cfg.n_layers - 1 in sweep.layers
    final_hooks, metric = ([], metric) if reads_last_mlp else _narrowed_last_block(model, metric, queries=False)
    cells = _cells(model, sweep, clean_tokens.shape[1], clean_tokens.device)
    flat_masks = cells.masks.flatten(1).float()
    if steps > 1:
        sources, targets, grads, clean_metric, corrupted_metric = _integrated_terms(
            model, clean_tokens, corrupted_tokens, metric, names, direction, final_hooks, steps=steps, max_batch=max_batch)
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
        source_tokens, self.target_tokens = (clean, corrupted) if sweep.direction == DIRECTIONS[0] else (corrupted, clean)
        # with the QK fix, the source's query (key) after rotary is what the patched logits read
        self.source_names = [self._qk_name(layer, sweep.kind) for layer in sweep.layers] if qk_fix else self.names
        with torch.no_grad(), model.hooks(fwd_hooks=final_hooks):
            source_logits, cache = model.run_with_cache(source_tokens, names_filter=lambda h: h in self.source_names)
        self.source = [cache[name] for name in self.source_names]
        target_logits, self.target, self.grads = self._backward(drop_layer=None)
        clean_logits, corrupted_logits = (source_logits, target_logits)[:: 1 if sweep.direction == DIRECTIONS[0] else -1]
        self.clean_metric, self.corrupted_metric = _baselines(metric, torch.cat([clean_logits, corrupted_logits]), clean.shape[0])

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
            hooks += [(f"blocks.{drop_layer}.hook_{part}_out", lambda act, hook: act.detach()) for part in ("attn", "mlp")]
        with torch.enable_grad(), self.model.hooks(fwd_hooks=hooks + self.final_hooks):
            logits = self.model(self.target_tokens)
            grads = torch.autograd.grad(_mean_metric(self.metric, logits), [saved[n] for n in wrt], allow_unused=True)
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
                change = (grad_pattern.unsqueeze(-2) * (patched - pattern.unsqueeze(-2))).sum(-1)  # [batch head query c]
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


# ---------------------------------------------------------------------------------------------
# Screening: estimate every cell, verify the most promising exactly (AtP*'s protocol)


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
        raise ValueError(f"estimate {tuple(estimate.raw.shape)} and exact {tuple(exact.raw.shape)} cover different cells")
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
        target = self.estimate.corrupted_metric if self.estimate.direction == DIRECTIONS[0] else self.estimate.clean_metric
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
