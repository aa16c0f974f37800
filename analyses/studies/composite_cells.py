"""What the composite studies (composite.py, composite_mechanism.py) share: the scales and base
configs, the protocols (fast, matched), and the measures taken of each trained cell."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from analyses.runners.cell import CellResult
from analyses.runners.study import Scales, StudyContext
from analyses.runners.sweep import grid_cells, grid_points
from interp.complexity import embedding_spectrum, leading_share, query_condensation
from interp.tasks.composite import (
    composite_verdict,
    held_out_on_training_keys,
)
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import get_preset
from models.runs import LoadedRun, load_run
from models.train import fastest_cpu_options
from tasks import CompositeConfig, CompositeTask, ConfigError

SEEN_LEARNED = 0.9  # the paper counts a run whose seen-pair accuracy is below this as unlearned
VERDICT_MARK = {"inferential": "I", "symmetric": "S", "mixed": "M", "unlearned": "U"}


@dataclass(frozen=True)
class CompositeScale:
    """What one scale of the composite studies trains and measures. `base`: the config every cell
    starts from, before the study's `--set`; `phase_grid`: composite-phase's grid, seed first
    (slowest) so that a run cut short has whole diagrams for the first seeds; `contrast_gammas`:
    composite-mechanism's small and large gamma; `lr_wd_grid`: composite-lr-wd's grid (one seed
    unless it says otherwise; `--seeds` adds more); `eval_samples`: fresh sequences per pair type
    for each cell's verdict."""

    base: Callable[[], RunConfig]
    phase_grid: dict[str, list[Any]]
    contrast_gammas: tuple[float, float]
    lr_wd_grid: dict[str, list[Any]]
    eval_samples: int


def _tiny_base() -> RunConfig:
    return RunConfig(task=CompositeConfig(),
                     model=ModelConfig(n_layers=2, d_model=32, n_heads=1, d_mlp=64, init_gamma=0.5),
                     train=TrainConfig(steps=10, batch_size=32, warmup_steps=2, eval_every=5, eval_size=64,
                                       checkpoint_every=10))


def _cpu_base() -> RunConfig:
    """The composite-cpu preset trained to the stop rule (seen-pair accuracy no higher over 5
    evaluations of 100 steps; at most 3,000 steps), compiled where a C++ compiler is at hand, with
    bf16 autocast where the CPU has bf16 kernels (about 3x the eager fp32 steps/s at depth 2,
    analyses/RESULTS.md). So the cells' configs depend on the machine: a study folder resumed on a
    machine with other options refuses its finished cells as another config; `--set
    train.precision=... --set train.compile=...` matches them."""
    cpu = get_preset("composite-cpu")
    return dataclasses.replace(cpu, train=dataclasses.replace(cpu.train, steps=3000, plateau_evals=5,
                                                              **fastest_cpu_options()))


def _matched_tiny_base() -> RunConfig:
    return _tiny_base().with_overrides(["model.biases=false", "model.act_fn=relu", "task.key_modulus=9",
                                        "train.lr=1e-4"])


def _matched_cpu_base() -> RunConfig:
    """The composite-matched preset (pre-LN, bias-free ReLU, test keys x mod 9, lr 1e-4, a stop rule
    that waits for the held-out answers, at most 30,000 steps), compiled where a C++ compiler is at
    hand. Always fp32, as every run of its recorded diagram: bf16 would be another protocol."""
    matched = get_preset("composite-matched")
    return dataclasses.replace(matched, train=dataclasses.replace(matched.train, precision="fp32",
                                                                  compile=fastest_cpu_options()["compile"]))


SCALES = Scales(
    CompositeScale,
    tiny=CompositeScale(_tiny_base, phase_grid={"train.seed": [0], "model.init_gamma": [0.3, 0.9],
                                                "model.n_layers": [1]},
                        contrast_gammas=(0.3, 0.9),
                        lr_wd_grid={"train.lr": [1e-3, 3e-3], "train.weight_decay": [0.01, 1.0]}, eval_samples=200),
    # phase: the paper's gammas and 0.9 at depth 2-5, 3 seeds and one learning rate (1e-3), to fit 60
    # minutes of 2 cores (the paper: 3 seeds x 9 learning rates; at depth 2 the pre-LN verdicts of gamma
    # 0.5 and 0.7 did not depend on the lr over 5e-4..2e-3, but gamma 0.8's did, analyses/RESULTS.md).
    # Contrast: 0.5 vs 0.7, the symmetric and inferential depth-2 cells of the pre-LN cpu phase diagram,
    # whose gamma 0.9 cells answered symmetrically
    cpu=CompositeScale(_cpu_base, phase_grid={"train.seed": [0, 1, 2],
                                              "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                                              "model.n_layers": [2, 3, 4, 5]},
                       contrast_gammas=(0.5, 0.7),
                       lr_wd_grid={"train.lr": [1e-3, 3e-3], "train.weight_decay": [0.01, 1.0]}, eval_samples=2000),
    # the composite-gpu preset (the paper's width and post-LN block, batch 2048, fresh data, to the stop
    # rule or 6,000 steps). Phase: the paper's gammas (0.3-0.8; at its width 400, gamma 0.9 is std
    # 0.0045) at depth 2-5, one learning rate. Contrast: the paper's gammas, at its width. lr x wd: the
    # paper's peak lr 2.5e-4, the preset's 5e-4 and twice that, times the paper's weight decays
    gpu=CompositeScale(partial(get_preset, "composite-gpu"),
                       phase_grid={"train.seed": [0, 1], "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                                   "model.n_layers": [2, 3, 4, 5]},
                       contrast_gammas=(0.5, 0.8),
                       lr_wd_grid={"train.lr": [2.5e-4, 5e-4, 1e-3], "train.weight_decay": [0.0, 0.01, 0.1, 1.0]},
                       eval_samples=5000),
    # phase: 3 seeds x 9 learning rates uniformly in [1e-4, 3e-4] per cell (docs/papers.md, section 2)
    paper=CompositeScale(partial(get_preset, "composite-paper"),
                         phase_grid={"train.seed": [0, 1, 2], "train.lr": [round(1e-4 + i * 2.5e-5,
                                                                                 7) for i in range(9)],
                                     "model.init_gamma": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8], "model.n_layers": [2, 3, 4, 5,
                                                                                                            6]},
                         contrast_gammas=(0.5, 0.8),
                         lr_wd_grid={"train.seed": [0, 1, 2], "train.lr": [1e-4, 2e-4, 3e-4, 5e-4],
                                     "train.weight_decay": [0.0, 0.01, 0.1, 1.0]},
                         eval_samples=5000),
)


# `--protocol matched`: the protocol nearest the paper's that gave both of its depth-2 corners on cpu
# (analyses/RESULTS.md, issue 27). Phase: the gammas around the corners (0.5 large init .. 1.0, std
# .088 .. .008 at width 128) at depth 2-4, 2 seeds: 24 runs of 11-49 minutes of one core each (measured
# beside other training), 11 hours of one core in all: 5-6 hours with --workers 2.
# Contrast: 0.5 vs 0.9, the symmetric and inferential depth-2 models of that protocol. lr x wd: its
# lr 1e-4 and the two larger ones it was measured at, times the weight decay of finding 5. Only the
# tiny and cpu scales: the gpu and paper scales train presets at the paper's width (composite-paper: its
# whole recipe).
MATCHED = {
    "tiny": CompositeScale(_matched_tiny_base, phase_grid=SCALES["tiny"].phase_grid, contrast_gammas=(0.5, 0.9),
                           lr_wd_grid=SCALES["tiny"].lr_wd_grid, eval_samples=200),
    "cpu": CompositeScale(_matched_cpu_base, phase_grid={"train.seed": [0, 1], "model.init_gamma": [0.5, 0.7, 0.9, 1.0],
                                                         "model.n_layers": [2, 3, 4]},
                          contrast_gammas=(0.5, 0.9),
                          lr_wd_grid={"train.lr": [1e-4, 3e-4, 1e-3], "train.weight_decay": [0.01, 1.0]},
                          eval_samples=2000),
}
PROTOCOLS = ("fast", "matched")  # `--protocol`; the first is the default


def scale_params(scale: str, protocol: str | None = None) -> CompositeScale:
    """What `scale` trains and measures under `protocol` ("fast", the default: SCALES; "matched":
    MATCHED)."""
    if protocol in (None, "fast"):
        return SCALES[scale]
    if protocol != "matched":
        raise ConfigError(f"--protocol {protocol!r} is unknown; use one of {PROTOCOLS}")
    if scale not in MATCHED:
        raise ConfigError(f"--protocol matched is a width-128 cpu protocol, declared at scales {tuple(MATCHED)}; "
                          f"at scale {scale!r} the study trains its own preset (composite-gpu: the paper's width and "
                          f"block; composite-paper: the paper's whole recipe), so leave --protocol out")
    return MATCHED[scale]


def base_config(scale: str, overrides: Sequence[str] = (), protocol: str | None = None) -> RunConfig:
    """The config every cell of `scale` starts from under `protocol`, with the study's `--set`
    overrides (e.g. model.norm_position=post)."""
    return scale_params(scale, protocol).base().with_overrides(list(overrides))


def with_seeds(grid: dict[str, list[Any]], ctx: StudyContext) -> dict[str, list[Any]]:
    """A copy of `grid` (a scale's, which stays as declared), with the caller's `--seeds` as its
    first (slowest) axis when given."""
    if not ctx.seeds:
        return {key: list(values) for key, values in grid.items()}
    return {"train.seed": list(ctx.seeds), **{k: list(v) for k, v in grid.items() if k != "train.seed"}}


def contrast_gammas(scale: str, chosen: tuple[float, float] | None = None, protocol: str | None = None
                    ) -> dict[str, float]:
    """The gammas of the mechanism study's two models: `chosen` (`--gammas SMALL,LARGE`), else
    the scale's under `protocol`."""
    small, large = chosen if chosen is not None else scale_params(scale, protocol).contrast_gammas
    return {"small_gamma": small, "large_gamma": large}


def with_model(cfg: RunConfig, **changes: Any) -> RunConfig:
    """`cfg` with its model section changed (validated like any other config)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **changes))


# ---------------------------------------------------------------------------------------------
# Per-cell measurements


def cell_measures(run: LoadedRun, n: int, seed: int = 0) -> dict[str, Any]:
    """Verdict, held-out rates, last-token cosines, query condensation and embedding spectrum."""
    verdict = composite_verdict(run.model, run.task, n=n, seed=seed)
    task: CompositeTask = run.task
    values = list(range(task.cfg.value_min, task.cfg.value_max + 1))
    spectrum = embedding_spectrum(run.model.W_E, values)
    return {
        **{k: v for k, v in verdict.to_dict().items() if k != "attention_flow"},
        **held_out_on_training_keys(run.model, task, n=n, seed=seed),
        "attention_flow": verdict.attention_flow,
        "query_condensation": query_condensation(run.model, 0).to_dict(),
        "embedding_top1": round(leading_share(spectrum, 1), 4), "embedding_top3": round(leading_share(spectrum, 3), 4),
        "embedding_spectrum": [round(x, 4) for x in spectrum[:8].tolist()],
    }


COMPLEXITY_KEYS = ("verdict", "seen_accuracy", "held_out_inferential", "held_out_symmetric", "cosine_same_target",
                   "cosine_different_target", "embedding_top1", "embedding_top3")


def complexity_row(run: LoadedRun, n: int) -> dict[str, Any]:
    """The phase study's per-run vectors and complexity columns (`cell_measures`) of one run, with
    its gamma, depth, width and step: what `--cells --complexity` prints."""
    measures = cell_measures(run, n)
    condensation = measures["query_condensation"]
    return {"init_gamma": run.config.model.init_gamma, "n_layers": run.config.model.n_layers,
            "d_model": run.config.model.d_model, "step": run.weights.step if run.weights else None,
            **{k: measures[k] for k in COMPLEXITY_KEYS}, "wq_share_aligned": condensation["share_aligned"],
            "wq_mean_abs_cosine": condensation["mean_abs_cosine"],
            "wq_random_baseline": condensation["random_baseline"]}


def train_and_measure(ctx: StudyContext, base: RunConfig, grid: dict[str, list[Any]]
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, CellResult], dict[str, dict[str, Any]]]:
    """The cell loop of the grid studies (phase, lr-wd): every combination of `grid` on `base`,
    trained (or found finished) under runs/, then measured. Returns each cell's grid point, its
    training result and its measures, by cell name."""
    cells = grid_cells(base, grid)
    points = dict(zip(cells, grid_points(grid)))
    trained = ctx.run_cells(cells, "runs")
    return points, trained, _measure_cells(ctx, trained, "runs")


def _measure_cells(ctx: StudyContext, results: dict[str, CellResult], subdir: str) -> dict[str, dict[str, Any]]:
    """Measures of every cell that trained; failed and diverged cells get only their status."""
    measured = {}
    for name, result in results.items():
        if result.status != "done":
            measured[name] = {"status": result.status,
                              "verdict": "unlearned" if result.status == "diverged" else "failed"}
            continue
        run = load_run(ctx.out / subdir / name)
        measured[name] = {"status": "done", "train_seconds": round(result.seconds, 1),
                          **cell_measures(run, scale_params(ctx.scale, ctx.protocol).eval_samples)}
    return measured
