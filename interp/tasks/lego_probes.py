"""LEGO's probe map: where each variable's value becomes linearly readable at its own token,
layer by layer (information percolation along the chain), the first layer reaching the threshold
per depth, and the slope and linearity of that line (a "for loop" is one layer per step).

Shape glossary: layer = residual streams (interp.probes), depth = LEGO chain index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.probes import ProbeSet, layer_names, probe_grid, rounded
from tasks import Batch, LegoTask, seeded_generator

FIRST_REACH_THRESHOLD = 0.95  # a depth is "solved" at a layer once its probe reaches it (docs/analysis.md, Probes)
MIN_PERCOLATION_DEPTHS = 3  # resolved depths a slope is fitted on: through two, any line fits exactly

# ---------------------------------------------------------------------------------------------
# Probes: information percolation along the chain


def first_layer_reaching(accuracy: Float[Tensor, "layer depth"],
                         threshold: float = FIRST_REACH_THRESHOLD) -> list[int | None]:
    """Per depth, the first layer whose probe accuracy is at least `threshold` (None if none)."""
    reached = accuracy >= threshold
    first = reached.float().argmax(0).tolist()
    return [layer if ok else None for layer, ok in zip(first, reached.any(0).tolist())]


def percolation_fit(first_layers: list[int | None]) -> tuple[float | None, float | None]:
    """Least-squares line through (depth, first layer) over the resolved depths (those that reach
    the threshold): its slope (layers per reasoning step) and R^2 (1 = perfectly linear, a "for
    loop"). Both None from fewer than MIN_PERCOLATION_DEPTHS resolved depths: two points always
    lie on a line. R^2 is None when the first layers are all equal (nothing to explain)."""
    points = [(depth, layer) for depth, layer in enumerate(first_layers) if layer is not None]
    if len(points) < MIN_PERCOLATION_DEPTHS:
        return None, None
    x, y = torch.tensor(points, dtype=torch.float64).T
    x_c, y_c = x - x.mean(), y - y.mean()
    slope = float((x_c * y_c).sum() / (x_c**2).sum())
    total = float((y_c**2).sum())
    residual = float(((y_c - slope * x_c) ** 2).sum())
    return slope, (1 - residual / total if total > 0 else None)


def resolved_depths(first_layers: list[int | None]) -> int:
    """How many depths reach the threshold at some layer: the points a percolation slope is fitted on."""
    return sum(layer is not None for layer in first_layers)


def percolation_summary(first_layers: list[int | None]) -> str:
    """The percolation line every report prints: slope and R^2 with the number of resolved depths
    they were fitted on, or why there is no slope."""
    slope, linearity = percolation_fit(first_layers)
    n, total = resolved_depths(first_layers), len(first_layers)
    if slope is None:
        return (f"no percolation slope: {n} of {total} depths resolved (reach the threshold); "
                f"a slope needs >= {MIN_PERCOLATION_DEPTHS}")
    fit = "n/a, every resolved depth first reaches it at the same layer" if linearity is None else f"{linearity:.2f}"
    return (f"percolation slope {slope:.2f} layers per reasoning step (R^2 {fit}), fitted on {n} of {total} "
            "resolved depths")


@dataclass
class ProbeMap:
    """LEGO probe accuracy per (layer, chain depth), read at each variable's own token."""

    accuracy: Float[Tensor, "layer depth"]
    train_accuracy: Float[Tensor, "layer depth"]
    layer_names: list[str]
    depth_names: list[str]
    chance: float  # 1 / n_classes
    majority: list[float]  # per depth, test accuracy of always answering the most frequent class
    threshold: float
    first_layer: list[int | None]  # per depth, first layer reaching `threshold`
    slope: float | None  # layers per reasoning step
    linearity: float | None  # R^2 of the slope's line
    n_train: int
    n_test: int
    method: str
    seconds: float  # wall time of the whole map: residuals, fits and scoring

    def to_dict(self) -> dict[str, object]:
        return {
            "accuracy": rounded(self.accuracy), "train_accuracy": rounded(self.train_accuracy),
            "layer_names": self.layer_names, "depth_names": self.depth_names, "chance": self.chance,
            "majority": [round(m, 4) for m in self.majority], "threshold": self.threshold,
            "first_layer": self.first_layer, "slope": self.slope,
            "linearity": self.linearity, "resolved_depths": resolved_depths(self.first_layer),
            "n_train": self.n_train, "n_test": self.n_test,
            "method": self.method, "seconds": round(self.seconds, 3),
        }


def lego_probe_set(task: LegoTask, batch: Batch) -> ProbeSet:
    """Sites are the variables' own (clause left-hand) tokens in chain order; targets their values."""
    return ProbeSet(batch.tokens, batch.label_pos, batch.labels.unsqueeze(-1), batch.label_mask)


def lego_probe_map(
    model: HookedTransformer, task: LegoTask, n_train: int = 3000, n_test: int = 2000, seed: int = 0,
    split: str = "test", method: str = "lda", threshold: float = FIRST_REACH_THRESHOLD,
) -> ProbeMap:
    """Where each variable's value becomes linearly readable at its own token, layer by layer.

    Probes are fitted on `n_train` sentences drawn with `seed` and scored on `n_test` fresh ones
    drawn with `seed + 1`. split="test" draws full-length sentences, so every depth has every
    sample; padded variables (split="train" with min_vars) are left out of fit and score.
    """
    start = time.perf_counter()
    train = lego_probe_set(task, task.sample(n_train, seeded_generator(seed), split))
    test = lego_probe_set(task, task.sample(n_test, seeded_generator(seed + 1), split))
    grid = probe_grid(model, train, test, task.d_vocab_out, method)
    accuracy = grid.accuracy[..., 0]
    first = first_layer_reaching(accuracy, threshold)
    slope, linearity = percolation_fit(first)
    return ProbeMap(accuracy, grid.train_accuracy[..., 0], layer_names(model), task.label_names, 1 / task.d_vocab_out,
                    grid.majority[:, 0].tolist(), threshold, first, slope, linearity, n_train, n_test, method,
                    time.perf_counter() - start)


def percolation_findings(first: list[int | None]) -> list[str]:
    return [f"probes: {percolation_summary(first)}; first layer reaching 95% per depth {first}"]
