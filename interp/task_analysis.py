"""What a task gives `workbench analyze`, its report, its timeline and the sweep page: a
`TaskAnalysis` subclass, one per task, in the task's module of interp/tasks/ (listed in
interp/tasks/__init__.py). It defines the four abstract methods and the caption, and overrides
any other member by name; the defaults below are what a task gets otherwise.

Also the helpers the task modules share: the model's answers on a batch, the counterfactual
pairs the patching metric reads, and how a chain of heads is named."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.head_evidence import PairSet, ShareProbe
from interp.patching import logit_diff_metric
from models.shapes import ANY, is_shape
from tasks import Batch, Task, TaskContractError, logits_at_labels, seeded_generator

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

    from interp.circuit import Circuit
    from models.runs import LoadedRun

ANALYSIS_DOC_SECTION = "docs/tasks.md, 'The analysis contract'"
FITTED_ACCURACY = 0.9  # the patching metric reads the deepest supervised variable at least this accurate


@runtime_checkable
class Finding(Protocol):
    """What a task's findings (its verdict, its probe map) are: objects that write themselves as
    the plain values of analysis.json."""

    def to_dict(self) -> dict[str, Any]: ...


Verdict = Finding  # the task's verdict: which solution the model found, with its evidence
Probes = Finding  # the task's probe map


class TaskAnalysis(ABC):
    """The task-specific steps of `workbench analyze`, of the run report, of the timeline and of
    the sweep page. Which members are required: docs/tasks.md, "The analysis contract"
    (`analysis_contract`, `check_analysis`)."""

    curves_caption: str = ""  # required: the caption under `curves`
    planted_note: str = ""  # HTML the report adds where a run's model has planted heads
    # What verdict_html, probes_html, verdict_label and verdict_rates read of a written verdict
    # and probe map (shapes of models.shapes.shape_problem): analysis.json and timeline.json
    # are checked against them where they are read, so those methods trust what they are given
    verdict_shape: Any = ANY
    probes_shape: Any = ANY

    @abstractmethod
    def findings(self, run: LoadedRun, seed: int) -> tuple[Probes | None, Verdict]:
        """The probe map (None for a task without one) and the verdict."""

    @abstractmethod
    def headline(self, verdict: Verdict) -> str:
        """The one line `workbench analyze` prints."""

    @abstractmethod
    def verdict_html(self, verdict: dict[str, Any]) -> str:
        """The report's verdict section, from analysis.json's verdict."""

    @abstractmethod
    def curves(self, run: LoadedRun) -> plt.Figure:
        """The training-curve figure."""

    def probes_html(self, probes: dict[str, Any]) -> str | None:
        """The report's probe section, from analysis.json's probes; None: the task has none."""
        return None

    def circuit_findings(self, verdict: Verdict, circuit: Circuit, labels: dict[str, str],
                         planted: set[str]) -> Verdict:
        """The verdict with what the circuit graph says (labels: "L1H0" -> head label; planted:
        the "L1H0" names of hardcoded heads). The default adds nothing."""
        return verdict

    def verdict_label(self, verdict: dict[str, Any]) -> str:
        """The verdict in one word or phrase, for the timeline: its "verdict" field, or "-"."""
        label = verdict.get("verdict")
        return label if isinstance(label, str) else "-"

    def timeline_panels(self, verdict: dict[str, Any]) -> dict[str, dict[str, float]]:
        """The evidence a timeline draws, as panel -> series -> value: every finite number of the
        verdict, its top-level numbers in one panel and each list or object field in its own."""
        panels: dict[str, dict[str, float]] = {}
        for key, value in verdict.items():
            numbers = dict(_numbers(key, value))
            if numbers:
                panels.setdefault("evidence" if _is_number(value) else key, {}).update(numbers)
        return panels

    def summary(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """A label and rates for the sweep page from a run's last metrics record, before it is
        analysed ({"label": ..., "rates": {name: value}}); None: the page shows the task's
        headline metric with the label "-"."""
        return None

    def verdict_rates(self, verdict: dict[str, Any]) -> dict[str, float]:
        """The few rates that decide a written verdict, named as `summary` names them: the first
        panel of `timeline_panels`."""
        return next(iter(self.timeline_panels(verdict).values()), {})

    def metric_words(self) -> dict[str, str]:
        """The task's metrics.jsonl fields in words with their unit, for the report's summary (the
        raw key stays in a tooltip); a field not named here is shown by its key."""
        return {}

    def share_probe(self, run: LoadedRun, seed: int) -> ShareProbe | None:
        """The pair sets a head's causal share is measured on, beside its label; None: the pairs of
        the patching section, whose per-head sweep is already measured."""
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(name: str, value: Any) -> Iterator[tuple[str, float]]:
    if _is_number(value):
        yield name, float(value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(f"{name}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(f"{name}.{key}", item)


REQUIRED_TEXT = ("curves_caption",)
OPTIONAL_TEXT = ("planted_note",)
SHAPES = ("verdict_shape", "probes_shape")  # optional: what a written verdict and probe map hold


def analysis_contract() -> dict[str, bool]:
    """TaskAnalysis's members, each with whether a task must give it (docs/tasks.md lists the same):
    the abstract methods and the required caption."""
    methods = [name for name, value in vars(TaskAnalysis).items() if callable(value) and not name.startswith("_")]
    return {name: name in TaskAnalysis.__abstractmethods__ or name in REQUIRED_TEXT
            for name in [*methods, *REQUIRED_TEXT, *OPTIONAL_TEXT, *SHAPES]}


def check_analysis(name: str, analysis: object) -> None:
    """TaskContractError naming the task, the member and the doc section where `analysis` is not a
    TaskAnalysis whose methods are functions and whose captions are strings (the required caption
    not empty); nothing is called."""
    def fail(what: str) -> TaskContractError:
        return TaskContractError(f"the analysis of task {name!r}: {what} (see {ANALYSIS_DOC_SECTION})")

    if not isinstance(analysis, TaskAnalysis):
        raise fail(f"it must be an instance of a interp.task_analysis.TaskAnalysis subclass, not "
                   f"{type(analysis).__name__}")
    for member, required in analysis_contract().items():
        value = getattr(analysis, member)
        if member in SHAPES:
            if not is_shape(value):
                raise fail(f"`{member}` is {value!r}; it must be a shape (models.shapes.shape_problem)")
        elif member in REQUIRED_TEXT or member in OPTIONAL_TEXT:
            if not isinstance(value, str) or (required and not value.strip()):
                raise fail(f"`{member}` is {value!r}; it must be a{' non-empty' if required else ''} string")
        elif not callable(value):
            raise fail(f"`{member}` is {value!r}; it must be a method")


# ---------------------------------------------------------------------------------------------
# Helpers the task modules share


@torch.no_grad()
def predictions(model: HookedTransformer, batch: Batch) -> Int[Tensor, "batch label"]:
    """The model's answer (argmax over the task's classes) at every label slot."""
    device = next(model.parameters()).device
    logits = model(batch.tokens.to(device))
    return logits_at_labels(logits, batch.label_pos.to(device)).argmax(-1).cpu()


def without_unset(data: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """`data` without the `optional` keys that are None: analysis.json holds what was measured."""
    return {key: value for key, value in data.items() if value is not None or key not in optional}


def counterfactual_pairs(
    task: Task, n: int, seed: int, model: HookedTransformer | None = None
) -> tuple[Batch, Batch, int, str]:
    """Aligned clean/corrupted pairs (the task's `counterfactual_pairs`), the label slot the
    metric reads, and what was changed. The slot is the deepest supervised one the model gets
    right (>= 90% on these inputs); the deepest supervised one when none is, or without a model."""
    clean, corrupted, description = task.counterfactual_pairs(n, seeded_generator(seed), aligned=True)
    slot = _deepest_fitted_slot(model, clean, task.supervised_slots())
    where = f"variable {task.label_names[slot]}" if len(task.label_names) > 1 else "the last position"
    return clean, corrupted, slot, f"{description}; metric at {where}"


def _deepest_fitted_slot(model: HookedTransformer | None, batch: Batch, supervised_slots: list[bool]) -> int:
    supervised = [slot for slot, s in enumerate(supervised_slots) if s]
    if model is None:
        return supervised[-1]
    accuracy = (predictions(model, batch) == batch.labels).float().mean(0)
    fitted = [slot for slot in supervised if accuracy[slot] >= FITTED_ACCURACY]
    return (fitted or supervised)[-1]


def default_share_probe(run: LoadedRun, seed: int = 0, n_pairs: int = 64) -> ShareProbe:
    """The pairs of the patching section (same n and seed) as the one set a head's share is read on."""
    clean, corrupted, slot, description = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    return ShareProbe([PairSet(clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, label_index=slot))],
                      description)


def named_chain(chain: list[str], labels: dict[str, str], planted: set[str]) -> str:
    """`L1H0 (manipulation) -> L2H0 (association, planted) -> logits`."""
    return " -> ".join(node if node == "logits"
                       else f"{node} ({labels.get(node, '?')}{', planted' * (node in planted)})"
                       for node in chain)
