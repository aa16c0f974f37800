"""The cells of a sweep folder as its page shows them (interp/sweep_page.py): each cell's status,
its verdict and where that verdict came from, its deciding rates, and links to its report and
timeline. Only reads: nothing is written into a run, and a damaged cell is described, never raised.

A sweep folder (analyses/runners/sweep.py) holds `sweep.json` (the index, written when the sweep ends),
`sweep_plan.json` (the grid and every cell's point, written when it starts, so a sweep still in
progress has a page) and `cells.json` (each finished cell's result, updated as cells end).

A cell's verdict comes from, in order: its analysis.json (`workbench analyze`), the last point of
its timeline.json (`workbench analyze --timeline`), or the last record of its metrics.jsonl through
the task's `TaskAnalysis.summary` (default: the task's headline metric, label "-"). Its label is
the task's `verdict_label` (interp/timeline.py), its rates the task's `verdict_rates` (default: the
first panel of `timeline_panels`). No task is named here."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from interp.analysis_file import read_analysis
from interp.task_analysis import TaskAnalysis
from interp.tasks import task_analysis
from interp.timeline import read_timeline
from models.runs import CONFIG, REPORT, TIMELINE, RunFolderError, read_config, read_metrics
from models.safe_files import present, read_checked, writer_pid
from tasks import ConfigError
from tasks.registry import registered_task

SWEEP_INDEX, SWEEP_PLAN, CELLS_INDEX = "sweep.json", "sweep_plan.json", "cells.json"
SEED_KEY = "train.seed"  # the grid key aggregated over (k of n) rather than drawn as an axis
# what a cell can be: trained to its end, a NaN loss, crashed or refused, its files unreadable,
# being trained now, not started, or started and stopped (a re-run of the sweep resumes it)
STATUSES = ("done", "diverged", "failed", "damaged", "running", "pending", "partial")


@dataclass
class SweepIndex:
    """What a sweep folder says of itself: its grid, every cell's point, and the results recorded
    so far (sweep.json's when it finished, else cells.json's)."""

    folder: Path
    grid: dict[str, list[Any]]
    points: dict[str, dict[str, Any]]  # cell name -> grid point, in the grid's order
    recorded: dict[str, dict[str, Any]]  # cell name -> status, error, refused, seconds
    finished: bool  # sweep.json is written
    preset: str | None = None
    task: str | None = None  # the base config's task
    notes: list[str] = field(default_factory=list)  # what could not be read of the sweep's own records


def is_sweep_folder(path: Path) -> bool:
    """Whether `path` holds a sweep (its sweep.json or sweep_plan.json)."""
    return (Path(path) / SWEEP_INDEX).is_file() or (Path(path) / SWEEP_PLAN).is_file()


def read_sweep_index(folder: Path) -> SweepIndex:
    """The sweep's index: sweep.json where the sweep finished, else sweep_plan.json with the
    cells.json entries so far. RunFolderError (exit 2) naming the file where it is damaged."""
    folder = Path(folder)
    finished = (folder / SWEEP_INDEX).is_file()
    path = folder / (SWEEP_INDEX if finished else SWEEP_PLAN)
    data = read_checked(path, _index_problem, again="it is damaged: run the sweep's command again to rewrite it")
    if data is None:
        raise RunFolderError(f"{folder} holds no sweep ({SWEEP_INDEX} or {SWEEP_PLAN})")
    points = {name: cell["point"] for name, cell in data["cells"].items()}
    recorded = {name: cell for name, cell in data["cells"].items() if "status" in cell}
    notes: list[str] = []
    if not finished:
        recorded = _cells_so_far(folder, notes)
    task = ((data.get("base") or {}).get("task") or {}).get("name")
    return SweepIndex(folder, data["grid"], points, recorded, finished, data.get("preset"), task, notes)


def _index_problem(data: Any) -> str | None:
    """What keeps `data` from being a sweep index (grid: key -> values; cells: name -> point), or None."""
    if not isinstance(data, dict) or not isinstance(data.get("grid"), dict) or not isinstance(data.get("cells"), dict):
        return "is not a sweep index (an object with `grid` and `cells`)"
    if not all(isinstance(v, list) and v for v in data["grid"].values()):
        return "holds a grid whose values are not non-empty lists"
    keys = set(data["grid"])
    wrong = [name for name, cell in data["cells"].items()
             if not isinstance(cell, dict) or not isinstance(cell.get("point"), dict) or set(cell["point"]) != keys]
    return f"holds cells without a point of the grid's keys: {wrong[:3]}" if wrong else None


def _cells_so_far(folder: Path, notes: list[str]) -> dict[str, dict[str, Any]]:
    """cells.json's entries (each a finished cell's result); {} where there is none or it is damaged."""
    try:
        data = read_checked(folder / CELLS_INDEX)
    except RunFolderError as err:
        notes.append(f"{err}; the cells' statuses are read from their folders")
        return {}
    return {name: entry for name, entry in data.items() if isinstance(entry, dict)} if isinstance(data, dict) else {}


@dataclass
class Cell:
    """One cell as the page shows it."""

    name: str
    point: dict[str, Any]
    status: str  # one of STATUSES
    label: str | None = None  # the verdict in a word (None: no source gave one)
    source: str | None = None  # analysis.json | timeline.json | metrics.jsonl
    step: int | None = None  # the step the verdict is of
    rates: dict[str, float] = field(default_factory=dict)  # the rates that decide it
    href: str = ""  # the cell's folder, relative to the sweep folder (where the page is)
    report: dict[str, Any] = field(default_factory=dict)  # href (relative to the sweep folder), exists
    timeline: dict[str, Any] | None = None  # href, decided_at, final_label, changes; None without timeline.json
    final: dict[str, Any] = field(default_factory=dict)  # the last evaluation's scalars
    error: str | None = None  # why it failed, or which file is damaged and how
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_cells(index: SweepIndex) -> list[Cell]:
    """Every cell of the sweep, in the grid's order."""
    return [read_cell(index.folder, name, point, index.recorded.get(name, {})) for name, point in index.points.items()]


def read_cell(folder: Path, name: str, point: dict[str, Any], recorded: dict[str, Any]) -> Cell:
    """One cell from its folder; a damaged file makes it `damaged`, naming the file."""
    run_dir = folder / name
    href = quote(name, safe="=,")
    cell = Cell(name, point, "pending", href=f"{href}/",
                report={"href": f"{href}/{REPORT}", "exists": (run_dir / REPORT).is_file()})
    if recorded.get("refused"):
        cell.status, cell.error = "damaged", _last_line(recorded.get("error"))
        return cell
    try:
        _fill_cell(cell, run_dir, recorded)
    except (RunFolderError, OSError) as err:
        cell.status, cell.error = "damaged", str(err)
    return cell


def _fill_cell(cell: Cell, run_dir: Path, recorded: dict[str, Any]) -> None:
    """Status, final metrics, verdict and timeline of a cell whose folder is there."""
    if not present(run_dir / CONFIG):
        cell.status = "running" if writer_pid(run_dir) else ("failed" if recorded.get("status") == "failed"
                                                             else "pending")
        cell.error = _last_line(recorded.get("error")) if cell.status == "failed" else None
        return
    cfg = read_config(run_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = read_metrics(run_dir)
    cell.notes += [str(w.message) for w in caught]
    cell.status = _status(run_dir, cfg.train.steps, metrics, recorded)
    if cell.status == "failed":
        cell.error = _last_line(recorded.get("error"))
    last = metrics[-1] if metrics else {}
    cell.final = {k: v for k, v in last.items() if isinstance(v, int | float | str) and not isinstance(v, bool)}
    _fill_verdict(cell, run_dir, task_analysis(cfg.task.name), cfg.task.name, last)


def _status(run_dir: Path, steps: int, metrics: list[dict[str, Any]], recorded: dict[str, Any]) -> str:
    """Where a cell with a config stands (STATUSES)."""
    last = metrics[-1] if metrics else {}
    if writer_pid(run_dir):
        return "running"
    if last.get("diverged"):
        return "diverged"
    if last and (last.get("step", 0) >= steps or last.get("stopped")):
        return "done"
    if recorded.get("status") == "failed":
        return "failed"
    return "partial" if metrics else "pending"


def _fill_verdict(cell: Cell, run_dir: Path, steps: TaskAnalysis, task: str, last: dict[str, Any]) -> None:
    """The verdict from the first source that has one (analysis.json, timeline.json,
    metrics.jsonl), and the timeline's summary where there is one."""
    analysis = read_analysis(run_dir)
    timeline = read_timeline(run_dir)
    if timeline is not None:
        summary = timeline["summary"]
        cell.timeline = {"href": f"{quote(run_dir.name, safe='=,')}/{TIMELINE}",
                         "decided_at": summary.get("decided_at"),
                         "final_label": summary.get("final_label"), "changes": len(summary.get("changes") or [])}
    if analysis is not None:
        cell.source, cell.step = "analysis.json", (analysis.get("weights") or {}).get("step")
        cell.label, cell.rates = _from_verdict(steps, analysis["verdict"])
    elif timeline is not None and timeline["points"]:
        point = timeline["points"][-1]
        cell.source, cell.step, cell.label = "timeline.json", point["step"], str(point["label"])
        cell.rates = _from_verdict(steps, point["verdict"])[1]
    elif last:
        cell.source, cell.step = "metrics.jsonl", last.get("step")
        found = steps.summary(last) or headline_summary(task, last)
        cell.label, cell.rates = str(found["label"]), _finite(found.get("rates") or {})


def _from_verdict(steps: TaskAnalysis, verdict: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """A written verdict's label and deciding rates (read from a file checked against the task's
    verdict_shape)."""
    return steps.verdict_label(verdict), _finite(steps.verdict_rates(verdict))


def headline_summary(task: str, record: dict[str, Any]) -> dict[str, Any]:
    """Any task's summary of a metrics record: its headline metric (`Task.headline_metric`) and
    the label "-"."""
    try:
        metric = registered_task(task).task.headline_metric
    except (ConfigError, AttributeError):
        return {"label": "-", "rates": {}}
    value = record.get(metric)
    return {"label": "-", "rates": {metric: value} if isinstance(value, int | float) else {}}


def _finite(rates: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of `rates`, rounded to 4 decimals."""
    return {str(k): round(float(v), 4) for k, v in rates.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _last_line(text: Any) -> str | None:
    """The last non-empty line of an error (a traceback's message)."""
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else None
