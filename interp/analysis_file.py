"""analysis.json as read back: checked against the schema this code writes, and an older file
upgraded to it (`read_analysis`). `interp.analysis.write_analysis` writes it."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch

from interp.patching import spearman
from interp.tasks import analysed_tasks, task_analysis
from models.runs import ANALYSIS, RunFolderError, verified_weights
from models.safe_files import nan_at, read_checked
from models.shapes import ANY, Grid, Keyed, Many, Maybe, OrNone, shape_problem

SCHEMA = 3  # the version of analysis.json written, as "schema"; a file without one is version 1 (UPGRADES)


def read_analysis(run_dir: Path) -> dict[str, Any] | None:
    """The run's analysis.json in the form this code writes (`RunAnalysis.to_dict`'s, schema
    SCHEMA: an older file is upgraded, `upgraded`), or None where it has none; RunFolderError
    naming the file and what is wrong where it is not JSON, not an analysis, or of a newer schema."""
    path = Path(run_dir) / ANALYSIS
    again = f"run `workbench analyze {run_dir}` again"
    data = read_checked(path, _schema_problem, again)
    if data is None:
        return None
    data = upgraded(data)
    if isinstance(data.get("non_finite"), dict):  # NaN written as null (strict JSON): NaN again, as written
        data = nan_at(data, data["non_finite"].get("where"))
    problem = _analysis_problem(data)
    if problem:
        raise RunFolderError(f"{path} {problem}; {again}")
    return data


def analysis_is_current(run_dir: Path) -> bool:
    """Whether the run's analysis.json read the weights the folder holds now (same sha256); False
    without one, or for one that does not record its weights."""
    analysis = read_analysis(run_dir)
    if analysis is None or not analysis["weights"]:
        return False
    return analysis["weights"].get("digest") == verified_weights(run_dir)[1].digest


def _schema_problem(data: Any) -> str | None:
    """What keeps `data` from being upgraded: not an object, or no schema this code reads; or None."""
    if not isinstance(data, dict):
        return f"is not a JSON object but {type(data).__name__}"
    version = data.get("schema", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return f"holds schema={version!r}, which is no version of analysis.json (1 to {SCHEMA})"
    if version > SCHEMA:
        return (f"is analysis.json schema {version}, newer than this workbench reads (schema 1 to {SCHEMA}): "
                f"update interp-workbench to read it, or rewrite it as schema {SCHEMA}")
    return None


def upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """An analysis.json of any schema up to SCHEMA in the form of SCHEMA, one version at a time;
    `data` itself is left as it was."""
    if data.get("schema", 1) < SCHEMA:
        data = copy.deepcopy(data)  # the upgrades fill fields in place
    for version in range(data.get("schema", 1), SCHEMA):
        data = UPGRADES[version](data)
    return data


# What the writers of schema 1 (no "schema" key) left out at one time or another, with the value
# that says "not recorded"; a key is filled where the object that holds it is there
_CIRCUIT = ("patching", "paths", "circuit")  # where analysis.json holds the circuit
SCHEMA_1_GAPS: list[tuple[tuple[str, ...], Any]] = [
    (("probes",), None), (("weights",), None), (("heads", "planted"), {}),
    (("patching", "heads_attribution_verified"), None), (("patching", "heads_estimates_verified"), {}),
    (("patching", "paths"), None), (_CIRCUIT, None), ((*_CIRCUIT, "ablation"), "resample"),
    *(((*_CIRCUIT, key), None) for key in ("faithfulness_mean", "edge_faithfulness", "edge_faithfulness_mean",
                                           "no_edge_faithfulness")),
    ((*_CIRCUIT, "candidate_edges"), 0), ((*_CIRCUIT, "rule"), "first"), ((*_CIRCUIT, "areas"), None),
]


def _upgrade_from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: every field a schema-1 writer could leave out, as not recorded
    (SCHEMA_1_GAPS), but attribution's Spearman with exact: computed from the two written head
    maps, as the writer computes it."""
    patching = data.get("patching")
    if isinstance(patching, dict) and "heads_attribution_spearman" not in patching:
        patching["heads_attribution_spearman"] = _written_spearman(patching)
    for keys, value in SCHEMA_1_GAPS:
        _fill(data, keys, value)
    return {"schema": 2, **data}


def _upgrade_from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: heads gained "where" (what a depth or gathering head reads) and "evidence"
    (each label's patching share, interp.head_evidence): not recorded."""
    for keys in (("heads", "where"), ("heads", "evidence")):
        _fill(data, keys, None)
    return {**data, "schema": 3}


UPGRADES = {1: _upgrade_from_1, 2: _upgrade_from_2}  # version -> its upgrade to the next


def _fill(data: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    """Set data[keys[0]]...[keys[-1]] to a copy of `value` where it is missing and every object
    above it is there."""
    for key in keys[:-1]:
        data = data.get(key) if isinstance(data, dict) else None
    if isinstance(data, dict) and keys[-1] not in data:
        data[keys[-1]] = copy.deepcopy(value)


def _written_spearman(patching: dict[str, Any]) -> float | None:
    """Attribution's Spearman with exact from the written maps (None where undefined or unreadable)."""
    try:
        value = spearman(torch.tensor(patching["heads_attribution"]["values"]),
                         torch.tensor(patching["heads"]["values"]))
    except (KeyError, TypeError, ValueError):  # a damaged file: the shape check (SHAPE) names what is wrong
        return None
    return value if math.isfinite(value) else None


ANALYSIS_FIELDS = {"schema": (int, "an integer"), "run": (str, "a string"), "task": (str, "a string"),
                   "heads": (dict, "an object"), "patching": (dict, "an object"),
                   "probes": ((dict, type(None)), "an object or null"), "verdict": (dict, "an object"),
                   "seconds": ((int, float), "a number"), "weights": ((dict, type(None)), "an object or null")}


def _analysis_problem(data: dict[str, Any]) -> str | None:
    """What keeps `data`, upgraded, from being an analysis.json this code draws, or None: its top
    level, its task, then every field the report reads (SHAPE, and the task's verdict_shape and
    probes_shape), so that the report's code trusts what it reads."""
    missing = [name for name in ANALYSIS_FIELDS if name not in data]
    if missing:
        return f"lacks {missing}"
    wrong = [f"{name} must be {kind}" for name, (types, kind) in ANALYSIS_FIELDS.items()
             if not isinstance(data.get(name), types)]
    if wrong:
        return f"holds fields of the wrong kind ({'; '.join(wrong)})"
    known = analysed_tasks()
    if data["task"] not in known:
        return f"names task={data['task']!r}, which is unknown; known: {known}"
    steps = task_analysis(data["task"])
    problem = (shape_problem(data, SHAPE) or shape_problem(data["verdict"], steps.verdict_shape, "verdict")
               or (shape_problem(data["probes"], steps.probes_shape, "probes") if data["probes"] is not None else None)
               or _heads_problem(data))
    return None if problem is None else f"is damaged or of another version ({problem}), so it cannot be shown"


# What the report draws from analysis.json (interp/analysis_html.py), as the writer writes it
# (interp/analysis.py), upgraded to SCHEMA: a field an older file lacks is null there
_SWEEP = {"values": Grid(float), "layers": Many(int), "clean_metric": float, "corrupted_metric": float}
_VERIFIED = {"k": int, "heads": int, "of": int}
_EDGE = (str, str, float)  # sender head, receiver (head.q/k/v or logits), effect
_CIRCUIT = {
    "nodes": Many(str), "edges": Many(_EDGE), "faithfulness": float, "target": float, "reached": bool,
    "faithfulness_mean": OrNone(float), "rule": str, "curve": Many(float), "candidate_edges": int,
    "edge_faithfulness": OrNone(float), "edge_faithfulness_mean": OrNone(float), "no_edge_faithfulness": OrNone(float),
    "areas": OrNone({"nodes": Keyed({"cpr": float, "cmd": float}),
                     "edges": OrNone({"n_edges": int, "ablation": str, "cpr": float, "cmd": float})}),
    # `workbench analyze --bootstrap` (interp/circuit_spread.py)
    "bootstrap": Maybe(OrNone({"percentiles": (float, float), "intervals": Keyed(OrNone((float, float))),
                               "stable": {"share": float, "nodes": Many(str), "edges": Many(str)},
                               "node_share": Keyed(float), "edge_share": Keyed(float), "resamples": int, "pairs": int,
                               "seed": int, "edges": ANY})),
}
_EVIDENCE = {"pairs": str, "shares": Grid(OrNone(float)), "status": Grid(str), "partner": Grid(OrNone(str)),
             "joint": Grid(OrNone(float)), "scores": Grid(OrNone(float)),
             "thresholds": {"used": float, "carries": float}}
SHAPE = {
    "heads": {"scores": Keyed(Grid(float)), "labels": Grid(str), "planted": Keyed(str), "evidence": OrNone(_EVIDENCE)},
    "patching": {
        "pairs": str, "n_pairs": ANY, "tokens": OrNone(Many(str)), "residual": _SWEEP, "heads": _SWEEP,
        "heads_attribution": _SWEEP, "heads_attribution_spearman": OrNone(float),
        "heads_attribution_verified": OrNone(_VERIFIED),
        "heads_estimates_verified": Keyed(OrNone({**_VERIFIED, "spearman": OrNone(float)})),
        "paths": OrNone({"strongest": Many(_EDGE), "circuit": OrNone(_CIRCUIT)}),
    },
}


def _heads_problem(data: dict[str, Any]) -> str | None:
    """Every per-head grid has the labels' shape (a circuit's head names need not: the drawing
    places only the heads it knows)."""
    labels = data["heads"]["labels"]
    size = (len(labels), len(labels[0]))
    if not data["heads"]["scores"]:
        return "heads.scores holds no kind of head"
    grids = {f"heads.scores.{kind}": grid for kind, grid in data["heads"]["scores"].items()}
    evidence = data["heads"]["evidence"] or {}
    grids.update({f"heads.evidence.{key}": evidence[key] for key in ("shares", "status", "partner", "joint", "scores")
                  if key in evidence})
    for where, grid in grids.items():
        if (len(grid), len(grid[0])) != size:
            return f"{where} is {len(grid)} x {len(grid[0])} where heads.labels is {size[0]} x {size[1]}"
    return None
