"""Curricula: a recipe trained in stages, each stage a run folder that starts from the weights of
the stage before it (`train.init_from`). Nothing is planted or mimicked along the way, so the
heads of the last stage are learned; what the curriculum changes is the task each stage sees.

`lego-three-hops` (analyses/RESULTS.md) is why this exists: on 2 CPU cores no plain LEGO model
follows three association hops from random init, but one that first learns one hop on an easier
task (six letters, #0-#2) keeps going: #0-#4 of n = 6, then #0-#4 of n = 8 with eight letters.
`workbench curriculum lego-three-hops --out DIR` trains it; each stage resumes like any run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.config import RunConfig
from models.presets import get_preset
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


LEGO_THREE_HOPS = Curriculum(
    name="lego-three-hops",
    preset="lego-cpu",
    common=("model.planted={}", "train.batch_size=512", "train.eval_every=250", "train.checkpoint_every=250",
            "train.eval_size=1000", "train.compile=true", "train.precision=bf16"),
    stages=(
        # the one-hop model (zoo lego-association's recipe): six letters, #0-#2 of n = 6
        Stage("1-one-hop", ("task.n_letters=6", "train.steps=2500")),
        # the same task, #0-#4 supervised: three hops for #4
        Stage("2-three-hops-n6", ("task.n_letters=6", "task.n_supervised=5", "train.steps=2000",
                                  "train.warmup_steps=100")),
        # the target: n = 8, eight letters, #0-#4 supervised, #5-#7 never
        Stage("3-three-hops-n8", ("task.n_vars=8", "task.n_letters=8", "task.n_supervised=5", "train.steps=1000",
                                  "train.warmup_steps=100")),
    ),
    about="a plain LEGO model (nothing planted or mimicked) taught three association hops in three stages: "
          "one hop with six letters (#0-#2 of 6), then #0-#4 of 6, then #0-#4 of n = 8 with eight letters",
)

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
    from models.train import Trainer

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
            Trainer(cfg, folder, resume=state == "partial", progress=progress).fit()
        final = read_metrics(folder)[-1]
        results.append(StageResult(folder.name, folder, {"done": "found", "partial": "resumed"}.get(state, "trained"),
                                   float(final.get("elapsed_s", 0.0)), final))
    return results


# ALBERT (every layer one shared block): the same stages, a longer first one. Seed 0 of the tied
# model stayed on the plateau through a 2,500-step first stage, where both BERT seeds left it
# (analyses/RESULTS.md).
LEGO_THREE_HOPS_ALBERT = Curriculum(
    name="lego-three-hops-albert",
    preset=LEGO_THREE_HOPS.preset,
    common=(*LEGO_THREE_HOPS.common, "model.tie_layers=true"),
    stages=(Stage("1-one-hop", ("task.n_letters=6", "train.steps=6000")), *LEGO_THREE_HOPS.stages[1:]),
    about="lego-three-hops for ALBERT (tied layers), with a 6,000-step first stage",
)

# The paper's task shape: after the three stages, n = 12 with twelve letters and #0-#5 supervised
# (the paper supervises the first half of its 12 variables). Meant for 12 layers on a GPU
# (analyses/gpu/lego12.sh); the stages before it are the ones above, unchanged.
LEGO_N12_STAGE = Stage("4-n12", ("task.n_vars=12", "task.n_letters=12", "task.n_supervised=6", "train.steps=2000",
                                 "train.warmup_steps=100"))
LEGO_N12 = dataclasses.replace(LEGO_THREE_HOPS, name="lego-n12", stages=(*LEGO_THREE_HOPS.stages, LEGO_N12_STAGE),
                               about="lego-three-hops, then the paper's task: #0-#5 of n = 12 with twelve letters")
LEGO_N12_ALBERT = dataclasses.replace(
    LEGO_THREE_HOPS_ALBERT, name="lego-n12-albert", stages=(*LEGO_THREE_HOPS_ALBERT.stages, LEGO_N12_STAGE),
    about="lego-three-hops-albert (tied layers), then #0-#5 of n = 12 with twelve letters")

CURRICULA = {c.name: c for c in (LEGO_THREE_HOPS, LEGO_THREE_HOPS_ALBERT, LEGO_N12, LEGO_N12_ALBERT)}


def get_curriculum(name: str) -> Curriculum:
    if name not in CURRICULA:
        raise ConfigError(f"curriculum {name!r} is unknown; use one of {sorted(CURRICULA)}")
    return CURRICULA[name]
