"""Curricula: a recipe trained in stages, each stage a run folder that starts from the weights of
the stage before it (`train.init_from`). Nothing is planted or mimicked along the way, so the
heads of the last stage are learned; what the curriculum changes is the task each stage sees.

A curriculum is a preset and, per stage, the overrides on top of it; a task declares its own
curricula (`register_curriculum`, from its module in interp/tasks/), so this module names no task.
`workbench curriculum NAME --out DIR` trains one; each stage resumes like any run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.config import RunConfig
from models.presets import get_preset, load_task_plugins
from models.runs import CONFIG, RunFolderError, read_config, read_metrics, run_state, same_recipe
from tasks import ConfigError


@dataclass(frozen=True)
class Stage:
    name: str  # its folder inside the curriculum's
    overrides: tuple[str, ...]  # on top of the curriculum's preset and common overrides


@dataclass(frozen=True)
class Curriculum:
    name: str
    preset: str
    common: tuple[str, ...]  # every stage's overrides
    stages: tuple[Stage, ...]
    about: str
    # what `workbench curriculum` prints of each stage's last metrics record: (metrics key, its words),
    # e.g. a per-variable accuracy list; () prints nothing more
    shown: tuple[str, str] | tuple[()] = ()

    def configs(self, folders: Sequence[Path | str], overrides: Sequence[str] = (),
                last: Sequence[str] = ()) -> list[RunConfig]:
        """Each stage's config, to train in `folders[i]`: stage i > 0 starts from `folders[i-1]`.
        `overrides` (e.g. `model.tie_layers=true`, `train.seed=1`) apply to every stage, after its
        own; `last` to the last stage only (e.g. what it supervises)."""
        if len(folders) != len(self.stages):
            raise ValueError(f"{self.name} has {len(self.stages)} stages; got {len(folders)} folders")
        for item in (*overrides, *last):
            if item.split("=", 1)[0].strip() == "train.init_from":
                raise ConfigError("a curriculum sets train.init_from itself (each stage starts from the one "
                                  "before); leave it out of --set")
        base = get_preset(self.preset)
        configs = []
        for i, stage in enumerate(self.stages):
            chain = () if i == 0 else (f"train.init_from={folders[i - 1]}",)
            final = tuple(last) if i == len(self.stages) - 1 else ()
            configs.append(base.with_overrides([*self.common, *stage.overrides, *chain, *overrides, *final]))
        return configs

    def folders(self, out: Path | str) -> list[Path]:
        """Where `workbench curriculum NAME --out OUT` trains each stage: OUT/<stage name>."""
        return [Path(out) / stage.name for stage in self.stages]


@dataclass
class StageResult:
    name: str
    folder: Path
    state: str  # trained | resumed | found (finished before this call)
    seconds: float  # training time of the stage (its last metrics record's elapsed_s)
    final: dict


def train_curriculum(curriculum: Curriculum, out: Path | str, overrides: Sequence[str] = (),
                     progress: bool = True) -> list[StageResult]:
    """Train every stage of `curriculum` into OUT/<stage>, in order. A finished stage is kept, a
    partial one resumes, so a killed curriculum continues where it stopped; a stage folder that
    holds a run of another config is refused before anything trains."""
    from models.train import train

    folders = curriculum.folders(out)
    configs = curriculum.configs(folders, overrides)
    for folder, cfg in zip(folders, configs):
        if (folder / CONFIG).exists() and not same_recipe(read_config(folder), cfg):
            raise RunFolderError(f"{folder} holds a run of another config than stage {folder.name} of "
                                 f"{curriculum.name}; move it away or choose another --out")
    results = []
    for folder, cfg in zip(folders, configs):
        state = run_state(folder, cfg)
        if state == "diverged":
            raise RunFolderError(f"stage {folder.name} diverged ({folder / 'metrics.jsonl'}); the stages after it "
                                 "cannot start from it")
        if state != "done":
            train(cfg, folder, resume=state == "partial", progress=progress)
        final = read_metrics(folder)[-1]
        results.append(StageResult(folder.name, folder, {"done": "found", "partial": "resumed"}.get(state, "trained"),
                                   float(final.get("elapsed_s", 0.0)), final))
    return results


CURRICULA: dict[str, Curriculum] = {}  # name -> curriculum, in registration order


def register_curriculum(curriculum: Curriculum) -> Curriculum:
    """Make `curriculum` known to `workbench curriculum` (a task's module in interp/tasks/ calls it)."""
    known = CURRICULA.get(curriculum.name)
    if known is not None and known != curriculum:
        raise RuntimeError(f"two curricula are named {curriculum.name!r}")
    CURRICULA[curriculum.name] = curriculum
    return curriculum


def all_curricula() -> dict[str, Curriculum]:
    """Every curriculum by name, in registration order."""
    load_task_plugins()
    return CURRICULA


def get_curriculum(name: str) -> Curriculum:
    if name not in all_curricula():
        raise ConfigError(f"curriculum {name!r} is unknown; use one of {sorted(CURRICULA)}")
    return CURRICULA[name]
