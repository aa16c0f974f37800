"""What a patch is measured by: the logit-difference metric, normalisation, and the rank agreement of two sweeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tasks import Batch

Metric = Callable[[Float[Tensor, "batch pos d_vocab_out"]], Float[Tensor, " batch"]]


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
        clean, corrupted = self.clean_label.to(logits.device), self.corrupted_label.to(logits.device)
        return at_label[rows, clean] - at_label[rows, corrupted]


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


def mean_metric(metric: Metric, logits: Tensor) -> Tensor:
    """The metric's mean over the pairs of `logits`; refuses a metric that does not return one
    value per pair."""
    values = metric(logits)
    if values.shape != (logits.shape[0],):
        raise ValueError(f"the metric returned shape {tuple(values.shape)}; it must return one value per pair, "
                         f"shape ({logits.shape[0]},) (patching averages it; do not reduce inside the metric). A "
                         f"TransformerLens-style metric that returns one number: wrap it, "
                         f"interp.outside_prompts.scalar_metric(fn) (docs/outside-models.md)")
    return values.mean()
