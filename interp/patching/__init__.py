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

One module per part, each public name importable from `interp.patching`: metrics.py (the
metric, its mean over the pairs, normalisation, rank agreement), sweep.py (the activations, a
validated request, its cells, the clean and corrupted baselines, `PatchResult`), exact.py
(`activation_patch` and its wrappers), attribution.py (`attribution_patch` and its wrappers),
screen.py (`screen_and_verify` and the AtP* yardstick).

Shape glossary: batch = counterfactual pairs, pos = token positions, layer, head_index,
d_model / d_head = the feature axis of an activation, d_vocab_out = output classes,
cell = one patched piece of one layer's activation.
"""

from interp.patching.attribution import (
    AFTER_RESID_MID,
    QK_KINDS,
    attribute_head_out,
    attribute_head_out_by_pos,
    attribute_residual,
    attribution_patch,
)
from interp.patching.exact import (
    activation_patch,
    forward_from,
    patch_head_out,
    patch_head_out_by_pos,
    patch_mlp_out,
    patch_residual,
    shortformer_positions,
)
from interp.patching.metrics import LogitDiff, Metric, logit_diff_metric, mean_metric, normalise, spearman
from interp.patching.screen import Screened, effect_sizes, screen_and_verify, verification_cost
from interp.patching.sweep import (
    ACTIVATIONS,
    DEFAULT_MAX_BATCH,
    DIRECTIONS,
    Activation,
    PatchResult,
    baseline_metrics,
    cell_masks,
    source_target_slices,
)

__all__ = ["ACTIVATIONS", "AFTER_RESID_MID", "DEFAULT_MAX_BATCH", "DIRECTIONS", "QK_KINDS", "Activation", "LogitDiff",
           "Metric", "PatchResult", "Screened", "activation_patch", "attribute_head_out", "attribute_head_out_by_pos",
           "attribute_residual", "attribution_patch", "baseline_metrics", "cell_masks", "effect_sizes",
           "forward_from", "logit_diff_metric", "mean_metric", "normalise", "patch_head_out", "patch_head_out_by_pos",
           "patch_mlp_out", "patch_residual", "screen_and_verify", "shortformer_positions", "source_target_slices",
           "spearman", "verification_cost"]
