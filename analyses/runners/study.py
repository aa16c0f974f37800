"""Studies: one module per experiment of the papers, each a `workbench study <name>` command.

A study module in `analyses/studies/` exposes `STUDIES`, a list of `Study`. Running one trains
its cells (through `analyses.runners.sweep.run_cells`, so it resumes), analyses them, and writes into
its folder a summary `report.html` and `results.json` with every number the report shows, both
through `StudyContext.finish`. A model a study trains is a `Cell`: what tells it apart from the
others (kind, tags, seed), with its folder name derived in one place. What changes with the scale
is declared once per module, as `SCALES`: a `Scales` of one frozen dataclass per scale."""

from __future__ import annotations

import dataclasses
import html
import importlib
import json
import pkgutil
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from models.runs import atomic_write_bytes, read_json
from tasks import ConfigError

# tiny: seconds, for smoke tests; cpu: < 30 min on 2 cores; gpu: one GPU, <= 10 min per model (by FLOP count);
# paper: the papers' sizes
SCALES = ("tiny", "cpu", "gpu", "paper")
P = TypeVar("P")


class Scales(Generic[P]):
    """A study module's parameters at every scale: one instance of a frozen dataclass (`params`)
    for each name in SCALES, declared together so the scales can be read side by side:
    `SCALES = Scales(TemplatesScale, tiny=TemplatesScale(...), cpu=..., gpu=..., paper=...)`,
    read as `SCALES[ctx.scale].steps`."""

    def __init__(self, params: type[P], **by_scale: P):
        if not (dataclasses.is_dataclass(params) and params.__dataclass_params__.frozen):
            raise TypeError(f"{params.__name__} must be a frozen dataclass: a scale's numbers are declared, "
                            "not changed")
        if tuple(by_scale) != SCALES:
            raise ValueError(f"{params.__name__}: scales {tuple(by_scale)} declared; declare {SCALES}, in that order")
        wrong = {name: type(value).__name__ for name, value in by_scale.items() if type(value) is not params}
        if wrong:
            raise TypeError(f"scales {wrong} are not {params.__name__}")
        self.params, self._by_scale = params, by_scale

    def __getitem__(self, scale: str) -> P:
        if scale not in self._by_scale:
            raise ConfigError(f"scale {scale!r} is unknown; use one of {SCALES}")
        return self._by_scale[scale]

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_scale)


@dataclass(frozen=True)
class Cell:
    """One model of a study, named by what tells it apart from the others.

    `Cell("albert", 0, ("L6",)).name == "albert-L6-s0"`: the folder it trains in and its key in
    results.json. `group` is the name without the seed (the cells a table averages over seeds);
    `seed=None` leaves the seed out of the name, for cells that are one seed by design."""

    kind: str
    seed: int | None = 0
    tags: tuple[str, ...] = ()

    @property
    def group(self) -> str:
        return "-".join((self.kind, *self.tags))

    @property
    def name(self) -> str:
        return self.group if self.seed is None else f"{self.group}-s{self.seed}"


def cell_names(cells: Mapping[Cell | str, Any]) -> dict[str, Any]:
    """The same mapping keyed by folder name (what run_cells and results.json use)."""
    named = {cell.name if isinstance(cell, Cell) else cell: value for cell, value in cells.items()}
    if len(named) != len(cells):
        raise ValueError(f"two cells share a name: {sorted(map(str, cells))}")
    return named


@dataclass
class StudyContext:
    """Where and how a study runs."""

    out: Path
    study: str = ""  # its name, for the report's "regenerate" line
    scale: str = "cpu"
    workers: int = 1
    backend: str = "local"
    address: str | None = None
    progress: bool = True
    seeds: tuple[int, ...] | None = None  # `--seeds 0,1`: replaces the study's own seeds
    overrides: tuple[str, ...] = ()  # `--set model.norm_position=post`: applied to every cell's base config
    gammas: tuple[float, float] | None = None  # `--gammas 0.5,0.8`: a contrast study's two init rates
    protocol: str | None = None  # `--protocol matched`: another training protocol (None: the study's default)
    ensemble: str = "auto"  # `--ensemble`: same-shape cells as one ensemble (analyses/runners/ensemble.py)

    def seeds_or(self, default: list[int]) -> list[int]:
        """The seeds to train: the caller's when given, else the study's default for its scale."""
        return list(self.seeds) if self.seeds else list(default)

    def run_cells(self, cells: Mapping[Cell | str, Any], where: Path | str = "runs") -> dict:
        """Train (or find finished) every cell in `where` (a folder under the study's, or a path)."""
        from analyses.runners.sweep import run_cells

        folder = where if isinstance(where, Path) else self.out / where
        return run_cells(cell_names(cells), folder, workers=self.workers, backend=self.backend,
                         address=self.address, progress=self.progress, ensemble=self.ensemble)

    def run_controls(self, cells: Mapping[Cell | str, Any], train: Callable[[str, Any], dict[str, Any]],
                     where: str = "controls") -> dict[str, dict[str, Any]]:
        """Cells trained by `train(name, config)` instead of the Trainer (a control model such as
        models/mlp_control.py), one after another in this process, with a progress bar. Each
        returns a JSON-able dict, kept as `where/<name>.json` beside its config, so a rerun skips
        the cells it finished; the dicts are returned by name, in `cells` order."""
        import sys

        from tqdm import tqdm

        folder = self.out / where
        folder.mkdir(parents=True, exist_ok=True)
        named = cell_names(cells)
        results: dict[str, dict[str, Any]] = {}
        bar = tqdm(total=len(named), desc=f"cells of {self.out.name}/{where}", unit="cell", disable=not self.progress,
                   mininterval=1.0 if sys.stderr.isatty() else 30.0)
        for name, cfg in named.items():
            path, config = folder / f"{name}.json", cfg.to_dict()
            saved = read_json(path) if path.exists() else None
            if saved is None or saved.get("config") != config:
                saved = {"config": config, **train(name, cfg)}
                atomic_write_bytes(path, json.dumps(saved, indent=1, default=float).encode())
            results[name] = saved
            bar.update(1)
            bar.set_postfix(cell=name)
        bar.close()
        return results

    def command(self) -> str:
        """The `workbench study` command line that (re)makes this study."""
        parts = [f"workbench study {self.study} --scale {self.scale}"]
        if self.protocol is not None:
            parts.append(f"--protocol {self.protocol}")
        if self.out != default_out(self.study, self.scale, self.protocol):
            parts.append(f"--out {self.out}")
        if self.seeds:
            parts.append(f"--seeds {','.join(map(str, self.seeds))}")
        parts += [f"--set {shlex.quote(o)}" for o in self.overrides]
        if self.gammas:
            parts.append(f"--gammas {','.join(map(str, self.gammas))}")
        return " ".join(parts)

    def finish(self, title: str, sections: Sequence[tuple[str, str]], results: dict[str, Any],
               models: Path | None = None) -> dict[str, Any]:
        """Write the study's report.html (a "How this was made" section, then `sections` as
        (heading, html) pairs) and results.json (`results`, plus the study, its scale and the
        report's path); return the results."""
        from interp.report import Report

        where = models if models is not None else self.out / "runs"
        regenerate = self.command()
        report = Report(title)
        report.add("How this was made", f"<p>Scale <code>{self.scale}</code>; models in <code>"
                   f"{html.escape(str(where))}</code>; numbers in <code>results.json</code>. Regenerate: <code>"
                   f"{html.escape(regenerate)}</code>.</p>")
        for heading, body in sections:
            report.add(heading, body)
        results = {"study": self.study, "scale": self.scale, **results,
                   "report": str(report.write(self.out / "report.html"))}
        atomic_write_bytes(self.out / "results.json", json.dumps(results, indent=1, default=float).encode())
        return results


@dataclass(frozen=True)
class Study:
    name: str  # e.g. "lego-extrapolation"
    summary: str  # one line for `workbench study --list`
    run: Callable[[StudyContext], dict[str, Any]]  # writes report.html and results.json, returns the results
    # the config its cells start from, given the scale, `--set` overrides and protocol; None: no --set
    base_config: Callable[[str, Sequence[str], str | None], Any] | None = None
    takes_gammas: bool = False  # a small- vs large-gamma contrast: `--gammas SMALL,LARGE` picks the pair
    protocols: tuple[str, ...] = ()  # the names `--protocol` takes, the default first; (): no --protocol


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


def _check_gammas(name: str, study: Study, gammas: Sequence[float]) -> tuple[float, float]:
    if not study.takes_gammas:
        takers = sorted(n for n, s in all_studies().items() if s.takes_gammas)
        raise ConfigError(f"study {name!r} does not take --gammas; {', '.join(takers)} does")
    if len(gammas) != 2 or not all(isinstance(g, float | int) and not isinstance(g, bool) and 0 < g < 10
                                   for g in gammas) or not gammas[0] < gammas[1]:
        raise ConfigError(f"--gammas {','.join(map(str, gammas))} must be two init rates SMALL,LARGE with "
                          "0 < SMALL < LARGE (e.g. 0.5,0.8)")
    return float(gammas[0]), float(gammas[1])


def run_folders(folder: Path) -> list[Path]:
    """The run folders directly under `folder` (a config.json beside a model.safetensors), by name:
    a sweep's cells, or runs trained one by one into a folder of their own."""
    return sorted(p for p in folder.iterdir() if (p / "config.json").is_file() and (p / "model.safetensors").is_file())


def how_it_ended(last: Mapping[str, Any], step: int | None, budget: int) -> str:
    """Why a run's training ended, from its last metrics record `last`: the stop rule's reason
    (e.g. "plateau"), "budget" when `step` is its last step, or "unfinished" (killed, or still
    training)."""
    return last.get("stopped") or ("budget" if step == budget else "unfinished")


def default_out(name: str, scale: str, protocol: str | None = None) -> Path:
    """runs/studies/<name>-<scale>, with -<protocol> when one is named."""
    return Path("runs/studies") / "-".join((name, scale, *([protocol] if protocol else [])))


def get_study(name: str) -> Study:
    studies = all_studies()
    if name not in studies:
        raise ConfigError(f"study {name!r} is unknown; use one of {sorted(studies)} (workbench study --list)")
    return studies[name]


def run_study(name: str, out: str | Path | None = None, scale: str = "cpu", **options: Any) -> dict[str, Any]:
    """Run a study into `out` (default runs/studies/<name>-<scale>, with -<protocol> when a
    protocol other than the default is named) and return its results."""
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
    if options.get("gammas") is not None:
        options["gammas"] = _check_gammas(name, study, options["gammas"])
    protocol = options.get("protocol")
    if protocol is not None:
        if not study.protocols:
            takers = sorted(n for n, s in all_studies().items() if s.protocols)
            raise ConfigError(f"study {name!r} does not take --protocol; {', '.join(takers)} do")
        if protocol not in study.protocols:
            raise ConfigError(f"--protocol {protocol!r} is unknown for {name}; use one of {study.protocols} "
                              f"(default {study.protocols[0]})")
        if protocol == study.protocols[0]:
            options["protocol"] = protocol = None  # the default, named: the same cells and folder as unnamed
    if study.base_config is not None:  # a bad --set value or protocol is refused before anything is written
        study.base_config(scale, options.get("overrides", ()), protocol)
    path = Path(out) if out is not None else default_out(name, scale, protocol)
    path.mkdir(parents=True, exist_ok=True)
    return study.run(StudyContext(out=path, study=name, scale=scale, **options))
