"""A run's solution timeline: the analysis of every snapshot of its weights (models/snapshots.py),
from step 0 to the final weights, so that *when* a solution forms can be read, not only which one
the last checkpoint holds. `workbench analyze RUN --timeline` writes it as timeline.json (schema
SCHEMA) and the report draws it (interp/timeline_html.py).

At every snapshot: the task's verdict and its evidence (`TaskAnalysis.findings`, probes included),
every head's label (`classify_heads`), exact patching of every head's output on the task's
counterfactual pairs, and the circuit in its cheap form: the fewest heads, by |exact effect|,
whose faithfulness under resample ablation stays at 0.9 (`find_circuit` without path patching, so
nodes and no edges). The pairs and the label slot the metric reads are fixed for the whole
timeline (the deepest supervised slot), so the points are comparable.

Generic: a task's evidence series come from its verdict (`TaskAnalysis.timeline_panels`, or every
number in the verdict grouped by field), and its one-word label from `TaskAnalysis.verdict_label`
(or the verdict's "verdict" field). A new task gets a timeline with no timeline code of its own."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from interp.analysis import task_findings
from interp.attention import classify_heads
from interp.circuit import find_circuit
from interp.patching import logit_diff_metric, patch_head_out
from interp.task_analysis import TaskAnalysis, counterfactual_pairs
from interp.tasks import analysed_tasks, task_analysis
from models.runs import (
    TIMELINE,
    LoadedRun,
    RunFolderError,
    atomic_write_bytes,
    load_weights,
    verified_weights,
)
from models.safe_files import read_checked
from models.shapes import ANY, Grid, Keyed, Many, Maybe, OrNone, first_problem, shape_problem
from models.snapshots import read_index, read_snapshot
from models.train import held_out_loss
from tasks import Batch, seeded_generator

SCHEMA = 1  # of timeline.json
# logits between clean and corrupted below which patching shares are not defined (an untrained model)
MIN_METRIC_GAP = 0.5
CARRIER_SHARE = 0.3  # a head carrying at least this share of the effect counts as a carrier
CROSSINGS = (0.5, 0.75, 0.95)  # the levels whose first crossing the summary gives, per evidence series
CIRCUIT_FORM = ("nodes only: the fewest heads by |exact effect| whose faithfulness under resample ablation "
                "stays at 0.9 (no path patching, so no edges)")


@dataclass(frozen=True)
class Moment:
    """One point of the timeline: a snapshot (or the final weights) and how to load it."""

    step: int
    reasons: tuple[str, ...]
    digest: str
    load: Callable[[], dict[str, torch.Tensor]]


def moments(run_dir: Path) -> list[Moment]:
    """The run's snapshots in step order, then its final weights where they are later than the
    last snapshot (a run still in training: its last checkpoint). RunFolderError (exit 2) when the
    run has no snapshots: it was trained with train.snapshots=0, or before snapshots existed."""
    entries = read_index(run_dir)
    if not entries:
        raise RunFolderError(f"{run_dir} has no snapshots ({run_dir / 'snapshots'}), so it has no timeline: it was "
                             f"trained with train.snapshots=0 or by an older workbench. Train it again to keep them "
                             f"(train.snapshots, docs/training.md)")
    points = [Moment(e.step, e.reasons, e.digest, lambda e=e: read_snapshot(run_dir, e)) for e in entries]
    tensors, stamp = verified_weights(run_dir)
    if stamp.step > entries[-1].step:
        points.append(Moment(stamp.step, ("final weights",), stamp.digest, lambda: tensors))
    return points


def analyze_timeline(run: LoadedRun, n_samples: int = 256, n_pairs: int = 64, seed: int = 0,
                     device: str | torch.device | None = None, progress: bool = True) -> dict[str, Any]:
    """The timeline of `run` as timeline.json holds it: one record per moment, and a summary
    (`summarize`). The model is left holding the weights it had."""
    if device is not None:
        run.model.to(device, print_details=False)
    started = time.perf_counter()
    steps = task_analysis(run.config.task.name)
    points = moments(run.path)
    clean, corrupted, slot, pairs = counterfactual_pairs(run.task, n_pairs, seed)  # one slot for every moment
    metric = logit_diff_metric(clean, corrupted, label_index=slot)
    batch = run.task.sample(n_samples, seeded_generator(seed), split="test")
    records = []
    with _weights_restored(run):
        for moment in tqdm(points, desc=f"timeline {run.path.name}", disable=not progress, dynamic_ncols=True):
            load_weights(run.model, {k: v.to(next(run.model.parameters()).device) for k, v in moment.load().items()},
                         source=f"the snapshot of step {moment.step}")
            records.append(_analyze_moment(run, steps, moment, clean, corrupted, metric, batch, seed))
    return {"schema": SCHEMA, "run": str(run.path), "task": run.config.task.name,
            "heads_origin": run.config.heads_origin, "pairs": pairs, "label_slot": slot,
            "loss_sample": f"{n_samples} test-split sequences drawn with seed {seed}, the same at every snapshot",
            "circuit_form": CIRCUIT_FORM, "points": records, "summary": summarize(records),
            "seconds": round(time.perf_counter() - started, 2)}


@torch.no_grad()
def _analyze_moment(run: LoadedRun, steps: TaskAnalysis, moment: Moment, clean: Any, corrupted: Any, metric: Any,
                    batch: Batch, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    device = next(run.model.parameters()).device
    at = dataclasses.replace(run, metrics=[m for m in run.metrics if m.get("step", 0) <= moment.step])
    probes, verdict = task_findings(steps, at, seed)
    written = verdict.to_dict()
    loss, _ = held_out_loss(run.model, batch.to(device))
    heads = classify_heads(run.model, run.task, batch.tokens)
    patching, circuit = _patching(run, clean.tokens.to(device), corrupted.tokens.to(device), metric)
    return {"step": moment.step, "reasons": list(moment.reasons), "digest": moment.digest,
            "loss": round(loss, 6) if math.isfinite(loss) else None,
            "label": steps.verdict_label(written), "panels": steps.timeline_panels(written), "verdict": written,
            "head_labels": heads.labels, **patching, **circuit,
            "probes": None if probes is None else probes.to_dict(), "seconds": round(time.perf_counter() - started, 2)}


def _patching(run: LoadedRun, clean: torch.Tensor, corrupted: torch.Tensor, metric: Any
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Exact head patching and the node circuit; shares are None where the clean and corrupted
    runs differ by less than MIN_METRIC_GAP logits (nothing to normalise by: an untrained model)."""
    try:
        result = patch_head_out(run.model, clean, corrupted, metric)
    except ValueError:  # clean and corrupted give the same metric
        return {"metric_gap": 0.0, "head_patching": None}, {"circuit": [], "circuit_faithfulness": None}
    gap = result.clean_metric - result.corrupted_metric
    if not math.isfinite(gap) or abs(gap) < MIN_METRIC_GAP:
        return {"metric_gap": round(gap, 4) if math.isfinite(gap) else None, "head_patching": None}, \
            {"circuit": [], "circuit_faithfulness": None}
    circuit = find_circuit(run.model, clean, corrupted, metric, result.values, None)
    return ({"metric_gap": round(gap, 4), "head_patching": result.values.round(decimals=4).tolist()},
            {"circuit": circuit.nodes, "circuit_faithfulness": circuit.faithfulness})


@torch.no_grad()
def _snapshot_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from models.factory import unique_parameters

    return {name: p.detach().clone() for name, p in unique_parameters(model).items()}


class _weights_restored:
    """Put the model's weights back when the timeline is done (a notebook keeps using `run`)."""

    def __init__(self, run: LoadedRun):
        self.run = run

    def __enter__(self) -> None:
        self.saved = _snapshot_of(self.run.model)

    def __exit__(self, *exc: object) -> None:
        load_weights(self.run.model, self.saved)


# ---------------------------------------------------------------------------------------------
# The summary: when the verdict settles, when each series crosses its levels, when each head forms


def summarize(points: list[dict[str, Any]]) -> dict[str, Any]:
    """When the verdict settles ("decided at step N": the first step from which every later moment
    has the final label) and every change of it; per evidence series, the first step at which it
    reaches each level of CROSSINGS; per head, the first step it carries CARRIER_SHARE of the
    effect, joins the circuit, and holds each label other than "mixed"."""
    labels = [(p["step"], p["label"]) for p in points]
    changes = [{"step": step, "from": before, "to": label}
               for (_, before), (step, label) in zip(labels, labels[1:]) if label != before]
    final = labels[-1][1] if labels else None
    decided = next((step for i, (step, _) in enumerate(labels) if all(lab == final for _, lab in labels[i:])), None)
    return {"final_label": final, "decided_at": decided, "changes": changes,
            "crossings": _crossings(points), "heads": _head_formation(points)}


def _crossings(points: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int | None]]]:
    """panel -> series -> level -> the first step the series reaches the level (None: never)."""
    out: dict[str, dict[str, dict[str, int | None]]] = {}
    for point in points:
        for panel, series in point["panels"].items():
            for name, value in series.items():
                levels = out.setdefault(panel, {}).setdefault(name, {str(level): None for level in CROSSINGS})
                for level in CROSSINGS:
                    if levels[str(level)] is None and value >= level:
                        levels[str(level)] = point["step"]
    return out


def _head_formation(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """"L1H3" -> first step as a carrier, first step in the circuit, and label -> first step."""
    heads: dict[str, dict[str, Any]] = {}
    for point in points:
        for layer, row in enumerate(point["head_labels"]):
            for head, label in enumerate(row):
                name = f"L{layer}H{head}"
                record = heads.setdefault(name, {"carrier_from": None, "circuit_from": None, "labels": {}})
                if label != "mixed":
                    record["labels"].setdefault(label, point["step"])
                share = None if point["head_patching"] is None else point["head_patching"][layer][head]
                if record["carrier_from"] is None and share is not None and abs(share) >= CARRIER_SHARE:
                    record["carrier_from"] = point["step"]
                if record["circuit_from"] is None and name in point["circuit"]:
                    record["circuit_from"] = point["step"]
    return heads


# ---------------------------------------------------------------------------------------------
# timeline.json


def write_timeline(run_dir: Path, timeline: dict[str, Any]) -> Path:
    path = Path(run_dir) / TIMELINE
    atomic_write_bytes(path, json.dumps(timeline, indent=1, allow_nan=False).encode())
    return path


TIMELINE_FIELDS = {"schema": int, "run": str, "task": str, "points": list, "summary": dict}


def read_timeline(run_dir: Path) -> dict[str, Any] | None:
    """The run's timeline.json, checked (None where it has none); RunFolderError naming the file
    when it is not a timeline this code reads."""
    return read_checked(Path(run_dir) / TIMELINE, _timeline_problem,
                        again=f"run `workbench analyze {run_dir} --timeline` again")


# What the report (interp/timeline_html.py) and the sweep page (interp/sweep_cells.py) read of
# timeline.json; each point's verdict has its task's verdict_shape besides
POINT_SHAPE = {"step": int, "reasons": Many(str), "label": str, "panels": Keyed(Keyed(float)), "verdict": dict,
               "head_labels": Grid(str), "head_patching": OrNone(Grid(OrNone(float))), "circuit": Many(str),
               "loss": Maybe(OrNone(float))}
SUMMARY_SHAPE = {"final_label": ANY, "decided_at": OrNone(int), "changes": Many({"step": int, "from": str, "to": str}),
                 "crossings": Keyed(Keyed(Keyed(OrNone(int)))),
                 "heads": Keyed({"carrier_from": OrNone(int), "circuit_from": OrNone(int), "labels": Keyed(int)})}


def _timeline_problem(data: Any) -> str | None:
    """What keeps `data` from being a timeline this code draws, or None: every field the report
    and the sweep page read, so that their code trusts what it reads."""
    if not isinstance(data, dict) or any(not isinstance(data.get(k), t) for k, t in TIMELINE_FIELDS.items()):
        return f"is not a timeline (an object with {sorted(TIMELINE_FIELDS)})"
    if data["schema"] != SCHEMA:
        return f"is timeline schema {data['schema']}; this workbench reads schema {SCHEMA}"
    if data["task"] not in analysed_tasks():
        return f"names task={data['task']!r}, which is unknown; known: {analysed_tasks()}"
    verdict = task_analysis(data["task"]).verdict_shape
    problem = (shape_problem(data["points"], Many(POINT_SHAPE, least=1), "points")
               or shape_problem(data["summary"], SUMMARY_SHAPE, "summary")
               or first_problem(shape_problem(p["verdict"], verdict, f"points[{i}].verdict")
                                for i, p in enumerate(data["points"])))
    if problem is None:
        size = _size(data["points"][0]["head_labels"])
        problem = next((f"points[{i}] has a {what} of another shape than the first point's head_labels"
                        for i, p in enumerate(data["points"]) for what in ("head_labels", "head_patching")
                        if p[what] is not None and _size(p[what]) != size), None)
    return None if problem is None else f"is damaged ({problem})"


def _size(grid: list[list[Any]]) -> tuple[int, int]:
    return len(grid), len(grid[0])

