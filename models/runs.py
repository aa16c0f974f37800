"""The run folder: config, weights, resumable train state and metrics, written atomically and
without pickle (safetensors for tensors, JSON for the rest)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from models.config import RunConfig
from tasks import Task, make_task

CONFIG, WEIGHTS, TRAIN_STATE, METRICS = "config.json", "model.safetensors", "train_state.safetensors", "metrics.jsonl"
MIMIC = "mimic.json"  # losses of mimicking pre-training, when the run had any
ANALYSIS, REPORT = "analysis.json", "report.html"
RUN_FILES = {CONFIG, WEIGHTS, TRAIN_STATE, METRICS, MIMIC, ANALYSIS, REPORT}  # what a run folder may hold
PACKAGES = ("interp-workbench", "torch", "transformer-lens", "circuitsvis", "numpy")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename: a killed process leaves the old file whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_tensors(path: Path, tensors: dict[str, Tensor], meta: dict[str, str] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    payload = {**cfg.to_dict(), "versions": package_versions()}
    atomic_write_bytes(run_dir / CONFIG, json.dumps(payload, indent=2).encode())


def read_config(run_dir: Path) -> RunConfig:
    data = json.loads((Path(run_dir) / CONFIG).read_text())
    data.pop("versions", None)
    return RunConfig.from_dict(data)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_state(run_dir: Path, cfg: RunConfig) -> str:
    """Where a run folder stands for `cfg`: `done` (weights, and metrics up to the last step),
    `diverged` (its last record says so), `partial` (a checkpoint to resume from) or `new`."""
    metrics = read_metrics(run_dir)
    if metrics and metrics[-1].get("diverged"):
        return "diverged"
    if (Path(run_dir) / WEIGHTS).exists() and metrics and metrics[-1].get("step") == cfg.train.steps:
        return "done"
    return "partial" if (Path(run_dir) / TRAIN_STATE).exists() else "new"


@dataclass
class LoadedRun:
    """A trained run, ready for analysis: config, task, model (eval mode) and metrics."""

    path: Path
    config: RunConfig
    task: Task
    model: Any  # HookedTransformer; typed loosely so tasks-only users need not import it
    metrics: list[dict[str, Any]]


def load_run(run_dir: str | Path, device: str = "cpu") -> LoadedRun:
    """Rebuild the model of a run folder and load its weights."""
    from models.factory import build_model

    run_dir = Path(run_dir)
    if not (run_dir / WEIGHTS).exists():
        raise FileNotFoundError(f"{run_dir / WEIGHTS} does not exist; train the run first (workbench train --out {run_dir})")
    cfg = read_config(run_dir)
    task = make_task(cfg.task)
    model = build_model(cfg.model, task, seed=cfg.train.seed, device=device)
    load_weights(model, load_file(str(run_dir / WEIGHTS)))
    model.eval()
    return LoadedRun(run_dir, cfg, task, model, read_metrics(run_dir))


def load_weights(model: torch.nn.Module, tensors: dict[str, Tensor]) -> None:
    from models.factory import unique_parameters

    params = unique_parameters(model)
    missing = set(params) - set(tensors)
    if missing:
        raise ValueError(f"the weights file lacks {sorted(missing)[:5]}...; was it written for another config?")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name])
