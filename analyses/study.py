"""Studies: one module per experiment of the papers, each a `workbench study <name>` command.

A study module in `analyses/studies/` exposes `STUDIES`, a list of `Study`. Running one trains
its cells (through `analyses.sweep.run_cells`, so it resumes), analyses them, and writes into
its folder a summary `report.html` and `results.json` with every number the report shows."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks import ConfigError

SCALES = ("tiny", "cpu", "paper")  # tiny: seconds, for smoke tests; cpu: < 30 min on 2 cores; paper: GPU


@dataclass
class StudyContext:
    """Where and how a study runs."""

    out: Path
    scale: str = "cpu"
    workers: int = 1
    backend: str = "local"
    address: str | None = None
    progress: bool = True
    seeds: tuple[int, ...] | None = None  # `--seeds 0,1`: replaces the study's own seeds
    overrides: tuple[str, ...] = ()  # `--set model.norm_position=post`: applied to every cell's base config

    def seeds_or(self, default: list[int]) -> list[int]:
        """The seeds to train: the caller's when given, else the study's default for its scale."""
        return list(self.seeds) if self.seeds else list(default)

    def run_cells(self, cells: dict, subdir: str = "runs") -> dict:
        from analyses.sweep import run_cells

        return run_cells(cells, self.out / subdir, workers=self.workers, backend=self.backend,
                         address=self.address, progress=self.progress)

    def write_results(self, results: dict[str, Any]) -> Path:
        path = self.out / "results.json"
        path.write_text(json.dumps(results, indent=1, default=float))
        return path


@dataclass(frozen=True)
class Study:
    name: str  # e.g. "lego-extrapolation"
    summary: str  # one line for `workbench study --list`
    run: Callable[[StudyContext], dict[str, Any]]  # writes report.html and results.json, returns the results
    # the config its cells start from, given the scale and `--set` overrides; None: no --set
    base_config: Callable[[str, Sequence[str]], Any] | None = None


def all_studies() -> dict[str, Study]:
    """Every study of every module in analyses/studies/, by name."""
    import analyses.studies as package

    found: dict[str, Study] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"analyses.studies.{info.name}")
        for study in getattr(module, "STUDIES", []):
            if study.name in found:
                raise RuntimeError(f"two studies are named {study.name!r}")
            found[study.name] = study
    return found


def get_study(name: str) -> Study:
    studies = all_studies()
    if name not in studies:
        raise ConfigError(f"study {name!r} is unknown; use one of {sorted(studies)} (workbench study --list)")
    return studies[name]


def run_study(name: str, out: str | Path | None = None, scale: str = "cpu", **options: Any) -> dict[str, Any]:
    """Run a study into `out` (default runs/studies/<name>-<scale>) and return its results."""
    if scale not in SCALES:
        raise ConfigError(f"--scale {scale!r} is unknown; use one of {SCALES}")
    if options.get("seeds") is not None:
        seeds = tuple(options["seeds"])
        if not seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds) \
                or len(set(seeds)) != len(seeds):
            raise ConfigError(f"seeds {seeds} must be distinct non-negative integers")
        options["seeds"] = seeds
    study = get_study(name)
    if options.get("overrides"):
        options["overrides"] = tuple(options["overrides"])
        if study.base_config is None:
            raise ConfigError(f"study {name!r} does not take --set; the composite studies do")
        if out is None:
            raise ConfigError("--set changes every cell, so name a study folder of its own with --out")
        study.base_config(scale, options["overrides"])  # a bad value is refused before anything is written
    path = Path(out) if out is not None else Path("runs/studies") / f"{name}-{scale}"
    path.mkdir(parents=True, exist_ok=True)
    return study.run(StudyContext(out=path, scale=scale, **options))
