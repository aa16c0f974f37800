"""Attribution estimates judged side by side the way AtP* judges them (Kramar et al. 2024):
verifying cells by exact patching in an estimate's order, the fraction of the exact sweep needed
before all of exact's top k cells (by |effect|) are verified; with Spearman's correlation (the
older yardstick) and the estimate's time beside it. One place for `workbench analyze`,
`workbench benchmark --patching` and `analyses.research.atp_yardstick`.

Cells (CELLS): head outputs, queries and keys, by position (layer x pos x head) and per head
(layer x head). Estimates (`estimates`): plain one-step attribution (AtP), GradDrop, integrated
gradients; for queries and keys also the QK fix, alone and with GradDrop (the QK fix redoes a
head's own softmax, so it has no meaning for the head's output)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching import Metric, PatchResult, activation_patch, attribution_patch, spearman, verification_cost

# cells: name -> (kind, over) of activation_patch / attribution_patch
CELLS = {"head x pos": ("head_out", ("pos", "head_index")), "head": ("head_out", ("head_index",)),
         "q x pos": ("q", ("pos", "head_index")), "k x pos": ("k", ("pos", "head_index")),
         "q head": ("q", ("head_index",)), "k head": ("k", ("head_index",))}


def estimates(cells: str, ig_steps: int) -> dict[str, dict[str, Any]]:
    """The estimates judged on `cells`: name -> attribution_patch options."""
    qk_fixed = {"qk-fix": {"qk_fix": True}, "qk-fix+graddrop": {"qk_fix": True, "grad_drop": True}}
    return {"atp": {}, **(qk_fixed if CELLS[cells][0] in ("q", "k") else {}), "graddrop": {"grad_drop": True},
            f"ig{ig_steps}": {"steps": ig_steps}}


@dataclass
class Judged:
    """One estimate against exact patching on one kind of cells."""

    estimate: PatchResult
    verified: int | None  # cells verified in its order until exact's top k are; None: nothing to find
    n_cells: int
    spearman: float  # with exact, over all cells (nan where either map is constant)
    seconds: float  # its wall-clock time, the fastest of the repeats

    @property
    def fraction(self) -> float:
        """The share of the exact sweep verified (nan where `verified` is None)."""
        return math.nan if self.verified is None else self.verified / self.n_cells


def judge_estimates(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, cells: str, exact: PatchResult, *, ig_steps: int = 4, k: int = 3, repeats: int = 1,
    names: Sequence[str] | None = None,
) -> dict[str, Judged]:
    """Each estimate of `estimates(cells, ig_steps)` (or those in `names`) against `exact`, the
    exact sweep of the same cells on the same inputs and metric. k is capped at the number of cells."""
    kind, over = CELLS[cells]
    n_cells = exact.values.numel()
    found = {}
    for name, options in estimates(cells, ig_steps).items():
        if names is not None and name not in names:
            continue
        estimate, seconds = _timed(partial(attribution_patch, model, clean_tokens, corrupted_tokens, metric, kind, over,
                                           **options), repeats)
        found[name] = Judged(estimate, _verified(estimate, exact, min(k, n_cells)), n_cells,
                             spearman(estimate.values, exact.values), seconds)
    return found


@dataclass
class CellsJudged:
    """Every estimate against the exact sweep on one kind of cells."""

    exact: PatchResult
    exact_seconds: float  # one run of the exact sweep
    estimates: dict[str, Judged]


def judge_all_cells(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, *, ig_steps: int = 4, k: int = 3, repeats: int = 1,
) -> dict[str, CellsJudged]:
    """`judge_estimates` on every kind of CELLS, each against its own exact sweep; kinds with no
    more than k cells are left out (any order verifies them all: nothing to judge)."""
    args = (model, clean_tokens, corrupted_tokens, metric)
    found = {}
    for cells, (kind, over) in CELLS.items():
        started = time.perf_counter()
        exact = activation_patch(*args, kind, over)
        seconds = time.perf_counter() - started
        if exact.values.numel() <= k:
            continue
        found[cells] = CellsJudged(exact, seconds, judge_estimates(*args, cells, exact, ig_steps=ig_steps, k=k,
                                                                   repeats=repeats))
    return found


def _timed(estimate: Callable[[], PatchResult], repeats: int) -> tuple[PatchResult, float]:
    fastest = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        result = estimate()
        fastest = min(fastest, time.perf_counter() - started)
    return result, fastest


def _verified(estimate: PatchResult, exact: PatchResult, k: int) -> int | None:
    """`verification_cost`, or None where no exact cell changes the metric or the estimate is
    not finite (no order can be judged)."""
    try:
        return verification_cost(estimate, exact, k)
    except ValueError:
        return None
