"""One trained run, looked into: head scores and labels, exact and attribution patching on the
task's own counterfactual pairs, then the task's own steps (probes, solution verdict), which
this module knows only through the task's `TaskAnalysis` (interp/task_analysis.py), looked up
by name in interp/tasks/__init__.py. `analyze_run` returns a `RunAnalysis` (the objects that
measured); `write_analysis` writes its `to_dict()` as analysis.json (schema SCHEMA,
interp/analysis_file.py, which reads it back). The report's sections are built from that written
form by `interp.analysis_html`."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from interp.analysis_file import SCHEMA
from interp.atp import Judged, judge_estimates
from interp.attention import HeadScores, classify_heads
from interp.circuit import Circuit, find_circuit, head_name
from interp.circuit_spread import bootstrap_circuit
from interp.head_evidence import HeadEvidence, head_evidence
from interp.patching import PatchResult, logit_diff_metric, patch_head_out, patch_residual
from interp.paths import PathPatchResult, check_path_patchable, path_patch
from interp.task_analysis import Probes, TaskAnalysis, Verdict, counterfactual_pairs, default_share_probe
from interp.tasks import task_analysis
from models.planted import parse_planted
from models.runs import (
    ANALYSIS,
    LoadedRun,
    atomic_write_bytes,
    non_finite_note,
    non_finite_weights,
)
from models.safe_files import finite_json
from tasks import TaskContractError, seeded_generator


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
    share_probe = steps.share_probe(run, seed)
    if share_probe is not None:
        evidence = head_evidence(run.model, heads, share_probe, task=run.task)
    else:  # the patching section's own pairs, whose per-head sweep is already measured
        evidence = head_evidence(run.model, heads, default_share_probe(run, seed), patching.heads.values, run.task)
    probes, verdict = task_findings(steps, run, seed)
    verdict = steps.circuit_findings(verdict, patching.circuit, _head_labels(heads, evidence),
                                     _planted_names(planted, heads))
    return RunAnalysis(str(run.path), run.config.task.name, heads, planted, patching, probes, verdict,
                       round(time.perf_counter() - started, 2), None if run.weights is None else run.weights.to_dict(),
                       evidence)


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
