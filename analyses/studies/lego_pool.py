"""The LEGO study's pool of models (lego.py says what each scale trains): the configurations of
each kind and scale, the pool folder they train in (through the sweep runner, so an experiment
finds the models another one trained), and what the experiments read back from them."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from analyses.runners.cell import CellResult
from analyses.runners.study import Cell, Scales, StudyContext
from interp.report import figure_html
from interp.tasks.lego import (
    lego_curves,
)
from interp.tasks.lego_presets import LEGO_THREE_HOPS, LEGO_THREE_HOPS_ALBERT
from models.config import ModelConfig, RunConfig, TrainConfig
from models.curriculum import Curriculum, Stage
from models.presets import get_preset
from models.runs import CONFIG, read_config, read_metrics, run_state
from tasks import ConfigError, LegoConfig, make_task

HARDCODED = {"*.0": "association", "*.1": "manipulation", "*.2": "broadcast"}


# ---------------------------------------------------------------- configurations


# tiny's curriculum: the cpu one's shape in seconds (two stages: #0-#1 of 4, then #0-#2 of 5)
TINY_CURRICULUM = Curriculum(
    name="lego-tiny", preset="lego-cpu",
    common=("model.planted={}", "model.n_layers=2", "model.d_model=24", "model.n_heads=3", "train.batch_size=16",
            "train.warmup_steps=2", "train.eval_every=4", "train.eval_size=64", "train.checkpoint_every=8"),
    stages=(Stage("1", ("task.n_vars=4", "task.n_supervised=2", "train.steps=8")),
            Stage("2", ("task.n_vars=5", "task.n_supervised=3", "train.steps=8"))),
    about="smoke test of the study's curriculum path", shown=("acc_per_var", "acc per variable"))


@dataclass(frozen=True)
class LegoScale:
    """What one scale of the LEGO studies trains and measures (the module docstring says what each
    scale is for). `base`: what `variant` builds on; `curricula`: BERT's and the tied kinds', which
    train the learned kinds (None: they train in one run); `seeds` of the comparisons, `pair_seeds`
    of the BERT vs ALBERT ones; `depths` of the extrapolation comparison (its deepest is
    percolation's and stochastic depth's); `probe_samples`: (train, test) sentences of a probe map;
    `rule_samples`: test sentences of the parity rules."""

    base: Callable[[], RunConfig]
    curricula: tuple[Curriculum, Curriculum] | None
    seeds: tuple[int, ...]
    pair_seeds: tuple[int, ...]
    depths: tuple[int, ...]
    mimic_steps: int
    probe_samples: tuple[int, int]
    rule_samples: int


def _tiny_base() -> RunConfig:
    return RunConfig(
        task=LegoConfig(n_vars=4, supervision="first", n_supervised=2),
        model=ModelConfig(n_layers=2, d_model=24, n_heads=3, positional="rotary", planted={"1.0": "association"}),
        train=TrainConfig(steps=12, batch_size=16, warmup_steps=2, eval_every=4, eval_size=64, checkpoint_every=12),
    )


def _paper_base() -> RunConfig:
    cfg = get_preset("lego-paper")
    planted = {f"{layer}.0": "association" for layer in range(1, cfg.model.n_layers)}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, planted=planted))


# The base: the hybrid (planted association heads, the rest learned), but plain at gpu scale, where a GPU's
# data budget is meant to let the heads be learned. Where curricula train the learned kinds, `variant` of
# those kinds is that hybrid, kept for the ground-truth comparisons. Depths: cpu the curriculum's 4, which
# follow three hops (#4; RESULTS.md); gpu 8 and 12, so that the deeper pair has a layer per chain step up to #11.
SCALES = Scales(
    LegoScale,
    tiny=LegoScale(_tiny_base, curricula=(TINY_CURRICULUM, TINY_CURRICULUM), seeds=(0,), pair_seeds=(0,),
                   depths=(2, 3), mimic_steps=5, probe_samples=(200, 200), rule_samples=200),
    cpu=LegoScale(partial(get_preset, "lego-cpu"), curricula=(LEGO_THREE_HOPS, LEGO_THREE_HOPS_ALBERT), seeds=(0,),
                  pair_seeds=(0, 1), depths=(4,), mimic_steps=300, probe_samples=(3000, 2000), rule_samples=2000),
    gpu=LegoScale(partial(get_preset, "lego-gpu"), curricula=None, seeds=(0, 1), pair_seeds=(0, 1), depths=(8, 12),
                  mimic_steps=1000, probe_samples=(3000, 2000), rule_samples=2000),
    paper=LegoScale(_paper_base, curricula=None, seeds=(0, 1, 2), pair_seeds=(0, 1, 2), depths=(12,), mimic_steps=2000,
                    probe_samples=(3000, 2000), rule_samples=2000),
)


def base_config(scale: str) -> RunConfig:
    """The base of the kinds `variant` builds at `scale`."""
    return SCALES[scale].base()


def variant(scale: str, kind: str, seed: int = 0, layers: int | None = None, **task: Any) -> RunConfig:
    """One model of the pool. kind: bert | albert | albert-sd (stochastic depth) | standard (no
    planted heads) | mimic (standard after mimicking pre-training) | hardcoded (association,
    manipulation and broadcast heads planted in every layer, nothing else) | hybrid3 (those three
    planted in every layer plus as many learned heads). `layers` changes the depth; a base with
    planted association heads (tiny, cpu, paper) then has them in every layer but the first, as
    in its recipe, and a plain base (gpu) stays plain."""
    cfg = base_config(scale)
    model, train = cfg.model, dataclasses.replace(cfg.train, seed=seed)
    if layers is not None and layers != model.n_layers:
        planted = {f"{layer}.0": "association" for layer in range(1, layers)} if model.planted else {}
        model = dataclasses.replace(model, n_layers=layers, planted=planted)
    if kind in ("albert", "albert-sd"):
        model = dataclasses.replace(model, tie_layers=True)
        if kind == "albert-sd":
            model = dataclasses.replace(model, min_depth=max(1, model.n_layers // 2))
    elif kind in ("standard", "mimic"):
        model = dataclasses.replace(model, planted={})
        if kind == "mimic":
            train = dataclasses.replace(train, mimic_steps=SCALES[scale].mimic_steps)
    elif kind in ("hardcoded", "hybrid3"):
        n_heads = 3 if kind == "hardcoded" else 6
        model = dataclasses.replace(model, n_heads=n_heads, d_head=max(8, model.d_model // 4), planted=dict(HARDCODED))
    elif kind != "bert":
        raise ConfigError(f"model kind {kind!r} is unknown")
    return RunConfig(task=dataclasses.replace(cfg.task, **task), model=model, train=train)


LEARNED_KINDS = ("bert", "albert", "albert-sd")  # trained by the scale's curricula where it has them


def curriculum(scale: str, kind: str = "bert") -> Curriculum | None:
    """The curriculum that trains a learned kind of a scale (cpu: `lego-three-hops`, for the tied
    kinds `lego-three-hops-albert`); None where the kind trains in one run (gpu: plain; paper:
    the hybrid; the other kinds)."""
    curricula = SCALES[scale].curricula
    if curricula is None or kind not in LEARNED_KINDS:
        return None
    bert, tied = curricula
    return bert if kind == "bert" else tied


def seeds(ctx: StudyContext, pairs: bool = False) -> list[int]:
    """The seeds of the comparisons, or with `pairs` of the BERT vs ALBERT comparisons of learned
    models: `--seeds` when given, else the scale's. Studies that analyse a single model
    (shortcut) take the first."""
    scale = SCALES[ctx.scale]
    return ctx.seeds_or(scale.pair_seeds if pairs else scale.seeds)


def pool_cell(scale: str, kind: str, seed: int, layers: int | None = None, *tags: str) -> Cell:
    """`albert-s0` at the base depth, `albert-L6-s0` at another; `tags` name other changes
    (`bert-s3-s0`: the S3 group)."""
    deeper = layers is not None and layers != base_config(scale).model.n_layers
    return Cell(kind, seed, (*tags, *((f"L{layers}",) if deeper else ())))


def plan(ctx: StudyContext, kind: str, seed: int, layers: int | None = None, *tags: str,
         **task: Any) -> tuple[Cell, list[RunConfig]]:
    """A pool model and the configs that train it: one, or a curriculum's stages (the learned
    kinds at tiny and cpu scale), the last of which is the model's. `task` changes the last
    stage (what it supervises), except the group, which every stage shares. The earlier stages
    train in `<pool>/stages/<trunk>-<stage>`, the trunk being the cell's name without the tags
    when those name a last-stage change only: `bert-lastsup-s0` is a last stage trained on
    bert-s0's first stages, not a curriculum of its own."""
    cell = pool_cell(ctx.scale, kind, seed, layers, *tags)
    course = curriculum(ctx.scale, kind)
    if course is None:
        return cell, [variant(ctx.scale, kind, seed, layers, **task)]
    every = [f"train.seed={seed}", f"model.tie_layers={str(kind != 'bert').lower()}"]
    if layers is not None:
        every.append(f"model.n_layers={layers}")
    if kind == "albert-sd":
        depth = get_preset(course.preset).with_overrides([*course.common, *every]).model.n_layers
        every.append(f"model.min_depth={max(1, depth // 2)}")
    if "group" in task:
        every.append(f"task.group={task.pop('group')}")
    trunk = pool_cell(ctx.scale, kind, seed, layers, *(() if task else tags))
    folders = [pool_dir(ctx) / "stages" / f"{trunk.name}-{stage.name}" for stage in course.stages[:-1]]
    return cell, course.configs([*folders, pool_dir(ctx) / cell.name], every,
                                [f"task.{key}={json.dumps(value)}" for key, value in task.items()])


def last_stages(planned: dict[Cell, list[RunConfig]]) -> dict[Cell, RunConfig]:
    return {cell: configs[-1] for cell, configs in planned.items()}


# ---------------------------------------------------------------- running and reading models


def pool_dir(ctx: StudyContext) -> Path:
    return ctx.out.parent / f"lego-runs-{ctx.scale}"


def train_pool(ctx: StudyContext, cells: dict[Cell, RunConfig | list[RunConfig]]) -> dict[str, CellResult]:
    """Train the cells into the pool: a cell planned as a curriculum's stages trains them in
    rounds (every cell's first stage, then every cell's second ...), each round through
    run_cells (so `--workers` train cells side by side, and a killed study resumes)."""
    staged = {cell: configs for cell, configs in cells.items() if isinstance(configs, list) and len(configs) > 1}
    for i in range(max((len(configs) for configs in staged.values()), default=1) - 1):
        stage = {Path(configs[i + 1].train.init_from).name: configs[i]
                 for configs in staged.values() if i + 1 < len(configs)}
        done = ctx.run_cells(stage, pool_dir(ctx) / "stages")
        failed = {name: r.error or r.status for name, r in done.items() if r.status != "done"}
        if failed:
            print(f"warning: curriculum stages failed, their models are left out: {failed}")
            staged = {c: cfgs for c, cfgs in staged.items() if Path(cfgs[i + 1].train.init_from).name not in failed}
    cells = {cell: configs[-1] if isinstance(configs, list) else configs for cell, configs in cells.items()
             if not isinstance(configs, list) or len(configs) == 1 or cell in staged}
    results = ctx.run_cells(cells, pool_dir(ctx))
    failed = {name: r.error for name, r in results.items() if r.status == "failed"}
    if failed:
        print(f"warning: cells failed and are left out: {failed}")
    return results


def finished(run_dir: Path) -> bool:
    return (run_dir / CONFIG).exists() and run_state(run_dir, read_config(run_dir)) == "done"


def final_accuracy(ctx: StudyContext, name: str) -> list[float] | None:
    records = [r for r in read_metrics(pool_dir(ctx) / name) if "acc_per_var" in r]
    return records[-1]["acc_per_var"] if records else None


def chance(cfg: RunConfig) -> float:
    """Accuracy of guessing: one over the number of values a variable can take (1/2 Z2, 1/3 S3)."""
    return 1 / make_task(cfg.task).d_vocab_out


def supervised_mask(cfg: RunConfig) -> list[bool]:
    n, k, mode = cfg.task.n_vars, cfg.task.n_supervised, cfg.task.supervision
    if mode == "all":
        return [True] * n
    return [i < k or (mode == "first+last" and i == n - 1) for i in range(n)]


def curves_html(ctx: StudyContext, name: str, cfg: RunConfig, caption: str) -> str:
    metrics = read_metrics(pool_dir(ctx) / name)
    if not metrics:
        return f"<p>{html.escape(name)}: no metrics (the cell failed).</p>"
    return figure_html(lego_curves(metrics, supervised_mask(cfg)), caption)


def accuracy_rows(ctx: StudyContext, cells: dict[Cell, RunConfig]) -> tuple[list[list[Any]], dict[str, list[float]]]:
    rows, table = [], {}
    for cell, cfg in cells.items():
        name = cell.name
        acc = final_accuracy(ctx, name)
        if acc is None:
            rows.append([name, "failed"])
            continue
        table[name] = acc
        marks = supervised_mask(cfg)
        rows.append([name, *[f"{a:.3f}{'' if s else ' *'}" for a, s in zip(acc, marks)]])
    return rows, table


def mean_over_seeds(table: dict[str, list[float]], cells: Iterable[Cell], group: str) -> list[float] | None:
    """Mean final accuracy per variable over the cells of `group` that trained."""
    rows = [table[cell.name] for cell in cells if cell.group == group and cell.name in table]
    return np.mean(rows, axis=0).round(4).tolist() if rows else None


def groups(cells: Iterable[Cell]) -> tuple[str, ...]:
    """The cells' groups (names without the seed), in order of first appearance."""
    return tuple(dict.fromkeys(cell.group for cell in cells))


def finish(ctx: StudyContext, title: str, sections: list[tuple[str, str]], results: dict[str, Any]) -> dict[str, Any]:
    return ctx.finish(title, sections, results, models=pool_dir(ctx))
