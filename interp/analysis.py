"""One trained run, looked into: head scores and labels, exact and attribution patching on the
task's own counterfactual pairs, then the task's own steps (probes, solution verdict), which
this module knows only through the registry `TASK_ANALYSES`: each module of `interp/tasks/`
registers its task's `TaskAnalysis` (`register_analysis`). `analyze_run` returns a `RunAnalysis`
(the objects that measured); `write_analysis` writes its `to_dict()` as analysis.json (schema
SCHEMA), which `read_analysis` (`interp/analysis_file.py`) reads back, upgrading a file of an
older schema one version at a time. The report's sections are built from that written form by `interp.analysis_html`.

Adding a task: one file in `tasks/` implementing `tasks.Task` (registered with
`tasks.registry.register_task`), and one in `interp/tasks/` registering its `TaskAnalysis` and
default preset."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import matplotlib.pyplot as plt
import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.analysis_file import SCHEMA, read_analysis, upgraded  # noqa: F401  (re-exported: analysis.json's readers)
from interp.atp import Judged, judge_estimates
from interp.attention import HeadScores, classify_heads
from interp.circuit import Circuit, find_circuit, head_name
from interp.circuit_spread import bootstrap_circuit
from interp.head_evidence import HeadEvidence, PairSet, ShareProbe, head_evidence
from interp.patching import PatchResult, logit_diff_metric, patch_head_out, patch_residual
from interp.paths import PathPatchResult, check_path_patchable, path_patch
from models.planted import parse_planted
from models.runs import (
    ANALYSIS,
    LoadedRun,
    atomic_write_bytes,
    non_finite_note,
    non_finite_weights,
)
from models.safe_files import finite_json
from tasks import Batch, ConfigError, Task, TaskContractError, logits_at_labels, seeded_generator

FITTED_ACCURACY = 0.9  # the patching metric reads the deepest supervised variable at least this accurate


@dataclass
class PatchingAnalysis:
    """Patching on the task's counterfactual pairs: exact sweeps, the per-head estimates judged
    against the exact one, path patching and the circuit graph."""

    pairs: str  # what the corruption changes, and where the metric reads
    n_pairs: int
    tokens: list[str]  # the first clean input, decoded (the heatmaps' position labels)
    residual: PatchResult  # exact, residual stream per layer and position
    heads: PatchResult  # exact, each head's output at every position
    estimates: dict[str, Judged]  # per-head estimates (interp.atp.estimates: "atp", "graddrop", "ig4") vs `heads`
    paths: PathPatchResult | None  # None where path patching refused the model
    paths_refused: str | None  # why, or None
    circuit: Circuit
    bootstrap: dict[str, Any] | None = None  # the circuit on resampled pairs (interp.circuit_spread), where asked for

    def to_dict(self) -> dict[str, Any]:
        attribution = self.estimates["atp"]
        spearman = attribution.spearman
        strongest = [[s, r, round(v, 4)] for s, r, v in self.paths.strongest(12)] if self.paths else []
        return {
            "pairs": self.pairs, "n_pairs": self.n_pairs, "tokens": self.tokens,
            "residual": self.residual.to_dict(), "heads": self.heads.to_dict(),
            "heads_attribution": attribution.estimate.to_dict(),
            # how far to trust the estimate on this run (README, Known limits); None when a sweep is constant
            "heads_attribution_spearman": spearman if math.isfinite(spearman) else None,
            "heads_attribution_verified": _verified(attribution),
            "heads_estimates_verified": {name: _verified(one, with_spearman=True)
                                         for name, one in self.estimates.items()},
            "paths": {"strongest": strongest, "refused": self.paths_refused, "circuit": {
                **self.circuit.to_dict(), **({} if self.bootstrap is None else {"bootstrap": self.bootstrap})}},
        }


def _verified(judged: Judged, k: int = 3, with_spearman: bool = False) -> dict[str, Any] | None:
    """AtP*'s yardstick: heads verified in the estimate's order until exact's top k are found (of
    all heads), and with_spearman its Spearman with exact (None where undefined); None when no head
    changes the metric or the estimate is not finite."""
    if judged.verified is None:
        return None
    found: dict[str, Any] = {"k": min(k, judged.n_cells), "heads": judged.verified, "of": judged.n_cells}
    if with_spearman:
        found["spearman"] = judged.spearman if math.isfinite(judged.spearman) else None
    return found


@runtime_checkable
class Finding(Protocol):
    """What a task's findings (its verdict, its probe map) are: objects that write themselves as
    the plain values of analysis.json."""

    def to_dict(self) -> dict[str, Any]: ...


Verdict = Finding  # the task's verdict: which solution the model found, with its evidence
Probes = Finding  # the task's probe map


def task_findings(steps: TaskAnalysis, run: LoadedRun, seed: int) -> tuple[Probes | None, Verdict]:
    """`steps.findings(run, seed)`, checked: a verdict (and a probe map, where there is one) that
    cannot write itself to analysis.json is the task's error, named as such, not the workbench's."""
    probes, verdict = steps.findings(run, seed)
    for what, found in (("verdict", verdict), ("probe map", probes)):
        if (found is not None or what == "verdict") and not callable(getattr(found, "to_dict", None)):
            raise TaskContractError(f"task {run.config.task.name!r}: its analysis's findings gave a {what} without "
                                    f"to_dict() (a {type(found).__name__}; see docs/tasks.md, 'The analysis contract')")
    return probes, verdict


@dataclass
class RunAnalysis:
    """What `workbench analyze` found in one run, as the objects that measured it; `to_dict` is
    analysis.json, the form the report is built from (`interp.analysis_html.analysis_sections`)."""

    run: str
    task: str
    heads: HeadScores
    planted: dict[str, str]  # the model's hardcoded heads, "layer.head" -> kind (ModelConfig.planted)
    patching: PatchingAnalysis
    probes: Probes | None  # None where the task has no probes
    verdict: Verdict  # the task's, with what the circuit graph adds
    seconds: float
    weights: dict[str, Any] | None = None  # the step and sha256 of the weights analysed (models.runs.WeightsStamp)
    evidence: HeadEvidence | None = None  # each label joined with the head's patching share (interp.head_evidence)

    def to_dict(self) -> dict[str, Any]:
        heads = {**self.heads.to_dict(), "planted": dict(self.planted),
                 "evidence": None if self.evidence is None else self.evidence.to_dict()}
        return {"schema": SCHEMA, "run": self.run, "task": self.task, "heads": heads,
                "patching": self.patching.to_dict(),
                "probes": None if self.probes is None else self.probes.to_dict(), "verdict": self.verdict.to_dict(),
                "seconds": self.seconds, "weights": None if self.weights is None else dict(self.weights)}


@dataclass(frozen=True)
class TaskAnalysis:
    """The task-specific steps of `workbench analyze` and of the run report.

    findings(run, seed) -> (probe map or None, verdict);
    circuit_findings(verdict, circuit, labels, planted) -> the verdict with what the circuit graph
      says (labels: "L1H0" -> head label; planted: "L1H0" names of hardcoded heads);
    headline(verdict) -> the one line `workbench analyze` prints;
    verdict_html, probes_html -> report sections, from analysis.json's verdict and probes;
    curves(run) -> the training-curve figure; curves_caption: the caption under it;
    planted_note -> HTML the report adds where a run's model has planted heads (what such a model
      of this task is not, and where to look instead);
    verdict_label(verdict dict) -> the verdict in a word or phrase, for the timeline (default: its
      "verdict" field);
    timeline_panels(verdict dict) -> panel title -> series name -> value: the evidence a timeline
      draws (default: every number of the verdict, grouped by field; interp/timeline.py);
    summary(last metrics.jsonl record) -> {"label": ..., "rates": {name: value}}, or None where the
      record lacks what it reads: a run's verdict without an analysis, for the sweep page (default:
      the task's headline metric and the label "-"; interp/sweep_cells.py);
    verdict_rates(verdict dict) -> name -> value: the few rates that decide the verdict, named as
      `summary` names them (default: the first panel of `timeline_panels`);
    share_probe(run, seed) -> the pair sets a head's causal share is measured on, beside its label
      (interp.head_evidence; default: the counterfactual pairs of the patching section).

    Which fields are required: docs/tasks.md, "The analysis contract" (`check_analysis`)."""

    findings: Callable[[LoadedRun, int], tuple[Probes | None, Verdict]]
    headline: Callable[[Verdict], str]
    verdict_html: Callable[[dict[str, Any]], str]
    probes_html: Callable[[dict[str, Any]], str] | None
    curves: Callable[[LoadedRun], plt.Figure]
    curves_caption: str
    circuit_findings: Callable[[Verdict, Circuit, dict[str, str], set[str]], Verdict] | None = None
    planted_note: str = ""
    verdict_label: Callable[[dict[str, Any]], str] | None = None
    timeline_panels: Callable[[dict[str, Any]], dict[str, dict[str, float]]] | None = None
    summary: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    verdict_rates: Callable[[dict[str, Any]], dict[str, float]] | None = None
    share_probe: Callable[[LoadedRun, int], ShareProbe] | None = None


TASK_ANALYSES: dict[str, TaskAnalysis] = {}  # task name -> its analysis, filled by the modules of interp/tasks/


ANALYSIS_DOC_SECTION = "docs/tasks.md, 'The analysis contract'"


def analysis_contract() -> dict[str, bool]:
    """TaskAnalysis's fields, each with whether it is required (docs/tasks.md lists the same)."""
    return {f.name: f.default is MISSING for f in fields(TaskAnalysis)}


def check_analysis(name: str, analysis: object) -> None:
    """TaskContractError naming the task, the field and the doc section where `analysis` is not a
    TaskAnalysis whose functions are functions and whose captions are strings (a required caption
    not empty); nothing is called."""
    def fail(what: str) -> TaskContractError:
        return TaskContractError(f"the analysis of task {name!r}: {what} (see {ANALYSIS_DOC_SECTION})")

    if not isinstance(analysis, TaskAnalysis):
        raise fail(f"register_analysis takes an interp.analysis.TaskAnalysis, not {type(analysis).__name__}")
    for field in fields(TaskAnalysis):
        value, required, kind = getattr(analysis, field.name), field.default is MISSING, str(field.type)
        optional = kind.endswith("| None")  # the annotation, a string here: "Callable[...] | None"
        if kind == "str":
            if not isinstance(value, str) or (required and not value.strip()):
                raise fail(f"`{field.name}` is {value!r}; it must be a{' non-empty' if required else ''} string")
        elif not (callable(value) or (value is None and optional)):
            raise fail(f"`{field.name}` is {value!r}; it must be a function{' or None' if optional else ''}")


def register_analysis(name: str, analysis: TaskAnalysis) -> None:
    """Make `analysis` the task `name`'s steps of `workbench analyze` and of its report; checked
    first (`check_analysis`)."""
    check_analysis(name, analysis)
    known = TASK_ANALYSES.get(name)
    if known is not None and known is not analysis:
        raise RuntimeError(f"two analyses are registered for task {name!r}")
    TASK_ANALYSES[name] = analysis


def analysed_tasks() -> list[str]:
    """The tasks with a registered analysis, sorted (every module of interp/tasks/ imported first)."""
    import interp.tasks  # noqa: F401 (its modules register their analyses on import)

    return sorted(TASK_ANALYSES)


def task_analysis(name: str) -> TaskAnalysis:
    known = analysed_tasks()
    if name not in TASK_ANALYSES:
        raise ConfigError(f"no analysis is registered for task {name!r}; known: {known}. Add interp/tasks/{name}.py "
                          f"(CONTRIBUTING.md)")
    return TASK_ANALYSES[name]


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


def patching_analysis(run: LoadedRun, n_pairs: int = 64, seed: int = 0, bootstrap: int = 0) -> PatchingAnalysis:
    """Exact, attribution and path patching on the task's pairs, and the circuit; with `bootstrap`
    > 0, the circuit found again on that many resamples of the pairs (interp.circuit_spread)."""
    clean, corrupted, slot, description = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    metric = logit_diff_metric(clean, corrupted, label_index=slot)
    device = next(run.model.parameters()).device
    args = (run.model, clean.tokens.to(device), corrupted.tokens.to(device), metric)
    heads = patch_head_out(*args)
    try:
        check_path_patchable(run.model)
        refused = None
    except ValueError as err:
        refused = str(err)
    paths = None if refused else path_patch(*args)
    return PatchingAnalysis(
        description, len(clean), run.task.token_strings(clean.tokens[0]), patch_residual(*args), heads,
        # per head: plain attribution, GradDrop and 4-step IG, judged against the exact sweep
        judge_estimates(*args, "head", heads, ig_steps=4),
        # path patching's edges, and the circuit they draw between the fewest heads keeping 90%, with every larger
        # set too (rule "stays", interp/circuit.py)
        paths, refused, find_circuit(*args, heads.values, paths),
        bootstrap_circuit(*args, n_resamples=bootstrap, seed=seed, edges=paths is not None) if bootstrap else None)


def analyze_run(
    run: LoadedRun, n_samples: int = 512, seed: int = 0, device: str | torch.device | None = None, bootstrap: int = 0
) -> RunAnalysis:
    """Everything the report shows. `device`: where the model runs (it is moved there, and every
    step moves the batches it samples on the CPU to it); None: where `run.model` already is
    (`load_run(..., device)`). `to_dict` gives the same plain values whatever the device.
    `bootstrap`: resamples of the pairs the circuit is found again on (0: none)."""
    if device is not None:
        run.model.to(device, print_details=False)
    started = time.perf_counter()
    steps = task_analysis(run.config.task.name)
    tokens = run.task.sample(n_samples, seeded_generator(seed), split="test").tokens
    heads = classify_heads(run.model, run.task, tokens)
    planted = dict(run.config.model.planted)  # hardcoded heads, not learned
    patching = patching_analysis(run, seed=seed, bootstrap=bootstrap)
    if steps.share_probe is not None:
        evidence = head_evidence(run.model, heads, steps.share_probe(run, seed), task=run.task)
    else:  # the patching section's own pairs, whose per-head sweep is already measured
        evidence = head_evidence(run.model, heads, default_share_probe(run, seed), patching.heads.values, run.task)
    probes, verdict = task_findings(steps, run, seed)
    if steps.circuit_findings is not None:
        verdict = steps.circuit_findings(verdict, patching.circuit, _head_labels(heads, evidence),
                                         _planted_names(planted, heads))
    return RunAnalysis(str(run.path), run.config.task.name, heads, planted, patching, probes, verdict,
                       round(time.perf_counter() - started, 2), None if run.weights is None else run.weights.to_dict(),
                       evidence)


def default_share_probe(run: LoadedRun, seed: int = 0, n_pairs: int = 64) -> ShareProbe:
    """The pairs of `patching_analysis` (same n and seed) as the one set a head's share is read on."""
    clean, corrupted, slot, description = counterfactual_pairs(run.task, n_pairs, seed, run.model)
    return ShareProbe([PairSet(clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, label_index=slot))],
                      description)


def _head_labels(heads: HeadScores, evidence: HeadEvidence | None = None) -> dict[str, str]:
    """"L1H0" -> its label, as the circuit's findings name it: with what a depth or gathering head
    reads, ", not used" where the answer does not depend on the head, and a mixed head that
    carries the answer as "mixed, carries 0.85" (`interp.head_evidence`)."""
    names = {}
    for layer, row in enumerate(heads.labels):
        for head, label in enumerate(row):
            status = evidence.status[layer][head] if evidence else "used"
            reads = evidence.reads[layer][head] if evidence and evidence.reads else None
            named = label if reads is None else f"{label} ({reads})"
            if status == "not used":
                named = f"{named}, not used"
            elif status == "unnamed":
                named = f"mixed, carries {evidence.shares[layer][head]:.2f}"
            names[f"L{layer}H{head}"] = named
    return names


def _planted_names(planted: dict[str, str], heads: HeadScores) -> set[str]:
    """The hardcoded heads as "L1H0" names ("*.0": head 0 of every layer)."""
    plan = parse_planted(planted, len(heads.labels), len(heads.labels[0]))
    return {head_name(layer, head) for layer, kinds in plan.items() for head in kinds}


def _named_chain(chain: list[str], labels: dict[str, str], planted: set[str]) -> str:
    """`L1H0 (manipulation) -> L2H0 (association, planted) -> logits`."""
    return " -> ".join(node if node == "logits"
                       else f"{node} ({labels.get(node, '?')}{', planted' * (node in planted)})"
                       for node in chain)


def write_analysis(run: LoadedRun, analysis: RunAnalysis) -> Path:
    """analysis.json, strict JSON (a browser's JSON.parse reads it): NaN and infinity are written
    as null, and a "non_finite" entry says how many, where, and why when the weights are the cause."""
    path = run.path / ANALYSIS
    data, places = finite_json(analysis.to_dict())
    weights = non_finite_weights(run.model)
    if places or weights:
        data["non_finite"] = non_finite_note(places, weights)
    atomic_write_bytes(path, json.dumps(data, indent=1, allow_nan=False).encode())
    return path
