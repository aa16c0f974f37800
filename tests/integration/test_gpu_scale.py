"""The `gpu` scale of every study: each study takes it, and every model it would train is a valid
config that asks for CUDA and bf16 and fits 10 minutes of an H100 by FLOP count; the LEGO models
are plain (nothing planted) on the paper's n = 12 task; one model of each study trains on the CPU
once shrunk, so that a GPU user's first run does not fail on a shape."""

import json

import pytest
from torch.utils.flop_counter import FlopCounterMode

from analyses.runners.study import SCALES, StudyContext, all_studies, cell_names, run_study
from analyses.runners.sweep import grid_cells
from analyses.studies import composite, composite_mechanism, lego, lego_pool, templates
from models.config import RunConfig
from models.factory import build_model
from models.presets import get_preset
from models.runs import read_config, read_metrics
from models.train import Trainer
from tasks import make_task, seeded_generator

SHRINK = ["train.device=cpu", "train.precision=fp32", "train.steps=2", "train.batch_size=4", "train.eval_every=2",
          "train.eval_size=16", "train.checkpoint_every=2", "train.warmup_steps=1", "train.plateau_evals=null"]
LEGO_KINDS = ("bert", "albert", "albert-sd", "standard", "mimic", "hardcoded", "hybrid3")
H100_FLOPS = 100e12  # bf16 FLOP/s of an H100 on d >= 256 models: the low end of 100-200, an estimate
BUDGET_FLOP = 600 * H100_FLOPS  # 10 minutes a model
MIMIC_BATCH = 64  # models.mimic.mimic_attention's batch
# the models each study trains at gpu scale: LEGO two seeds, depths 8 and 12; composite 2 seeds x
# 6 gammas x 4 depths, 2 contrast models, 3 lr x 4 weight decays; templates as in templates.SCALES
# (templates-mlp-control's MLPs are counted as the transformer of their config, a stand-in: the
# one-hot MLP at gpu scale is ~20M parameters, ~0.3 PFLOP a model)
N_CELLS = {"lego-extrapolation": 8, "lego-percolation": 4, "lego-stochastic-depth": 4, "lego-mimic": 4,
           "lego-shortcut": 3, "lego-heads": 4, "lego-hardcoded": 6, "lego-s3": 4, "composite-phase": 48,
           "composite-mechanism": 2, "composite-lr-wd": 12, "templates-efficiency": 54, "templates-copy-width": 40,
           "templates-heads": 4, "templates-mlp-control": 54}
_flop_per_sample: dict[str, float] = {}


class Trained(Exception):
    """Raised where a study would start training: the cells it was handed are what a test reads."""


def cells_at_gpu_scale(name, out, monkeypatch) -> dict[str, RunConfig]:
    """The models `workbench study NAME --scale gpu` would train, by folder name."""
    found = {}

    def capture(ctx, cells, where="runs"):
        found.update(cell_names(cells))
        raise Trained

    monkeypatch.setattr(StudyContext, "run_cells", capture)
    monkeypatch.setattr(StudyContext, "run_controls", lambda ctx, cells, train, where="controls": capture(ctx, cells))
    with pytest.raises(Trained):
        run_study(name, out, "gpu", progress=False)
    return found


def training_flop(cfg: RunConfig) -> float:
    """FLOP of a whole run: forward and backward of every training sample, mimicking included,
    counted by torch on one sample's shape (evaluations add under 1%)."""
    data = cfg.to_dict()
    key = json.dumps([data["task"], {k: v for k, v in data["model"].items() if k != "init_gamma"}])
    if key not in _flop_per_sample:
        task = make_task(cfg.task)
        model = build_model(cfg.model, task)
        tokens = task.sample(2, seeded_generator(0)).tokens
        with FlopCounterMode(display=False) as counter:
            model(tokens).sum().backward()
        _flop_per_sample[key] = counter.get_total_flops() / 2
    return _flop_per_sample[key] * (cfg.train.batch_size * cfg.train.steps + MIMIC_BATCH * cfg.train.mimic_steps)


def test_gpu_sits_between_cpu_and_paper():
    assert SCALES.index("cpu") < SCALES.index("gpu") < SCALES.index("paper")
    assert set(N_CELLS) == set(all_studies())  # a new study needs its gpu scale checked here


@pytest.mark.parametrize("name", sorted(N_CELLS))
def test_every_study_takes_the_gpu_scale_and_each_model_fits_ten_minutes(tmp_path, monkeypatch, name):
    cells = cells_at_gpu_scale(name, tmp_path / name, monkeypatch)
    assert len(cells) == N_CELLS[name]
    for cell, cfg in cells.items():
        assert RunConfig.from_dict(json.loads(cfg.to_json())) == cfg  # config.json gives the trainer the same run
        assert (cfg.train.device, cfg.train.precision) == ("cuda", "bf16"), cell
        flop = training_flop(cfg)
        assert flop <= BUDGET_FLOP, f"{cell}: {flop / 1e15:.1f} PFLOP, over 10 min at {H100_FLOPS / 1e12:.0f} TFLOP/s"


def test_lego_gpu_models_are_plain_on_the_papers_task_with_two_seeds_and_depths_8_and_12(tmp_path, monkeypatch):
    base = lego_pool.base_config("gpu")
    assert base == get_preset("lego-gpu") and base.model.planted == {}
    assert (base.task.n_vars, base.task.n_supervised, base.model.n_layers) == (12, 6, 8)
    cells = cells_at_gpu_scale("lego-extrapolation", tmp_path / "x", monkeypatch)
    assert set(cells) == {f"{kind}{deeper}-s{seed}" for kind in ("bert", "albert") for deeper in ("", "-L12")
                          for seed in (0, 1)}
    assert all(cfg.model.planted == {} and cfg.task.n_vars == 12 for cfg in cells.values())
    for kind in LEGO_KINDS:
        for layers in lego_pool.SCALES["gpu"].depths:
            cfg = lego_pool.variant("gpu", kind, seed=1, layers=layers)
            assert (cfg.task.n_vars, cfg.task.n_supervised, cfg.model.n_layers) == (12, 6, layers)
            planted = {"*.0": "association", "*.1": "manipulation", "*.2": "broadcast"}
            assert cfg.model.planted == (planted if kind in ("hardcoded", "hybrid3") else {})
    assert lego_pool.variant("gpu", "bert") == lego_pool.variant("gpu", "standard")  # plain: the same recipe
    assert lego_pool.variant("gpu", "albert").model.tie_layers
    assert lego_pool.variant("gpu", "albert-sd", layers=12).model.min_depth == 6
    assert lego_pool.variant("gpu", "mimic").train.mimic_steps == 1000
    assert lego_pool.variant("cpu", "bert", layers=6).model.planted == {f"{i}.0": "association" for i in range(1, 6)}


def test_composite_gpu_cells_use_the_papers_width_gammas_and_post_ln():
    cells = grid_cells(composite.base_config("gpu"), composite.SCALES["gpu"].phase_grid)
    assert {(c.model.init_gamma, c.model.n_layers) for c in cells.values()} == {
        (g, d) for g in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8) for d in (2, 3, 4, 5)}
    for cfg in cells.values():
        assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.d_head, cfg.model.d_mlp) == (400, 1, 200, 1200)
        assert cfg.model.norm_position == "post" and cfg.train.batch_size == 2048 and cfg.train.n_train is None
        assert cfg.train.plateau_evals == 5 and cfg.train.steps == 6000
    assert {c.model.init_gamma for c in composite_mechanism.contrast_cells("gpu").values()} == {0.5, 0.8}
    assert composite.SCALES["gpu"].eval_samples == 5000


def test_templates_gpu_scale_lies_between_cpu_and_paper():
    gpu, cpu, paper = (templates.SCALES[s] for s in ("gpu", "cpu", "paper"))
    assert cpu.steps < gpu.steps < paper.steps and cpu.d_model < gpu.d_model < paper.d_model
    assert max(cpu.ns) < max(gpu.ns) == max(paper.ns)
    cfg = templates.cell_config("gpu", "same_different", 4096, augmented=True)
    assert cfg.task.n_train_symbols == 4096 and cfg.model.identity_attention and cfg.model.d_model == 256
    cpu_cfg = templates.cell_config("cpu", "same_different", 256, augmented=True)
    assert (cpu_cfg.train.device, cpu_cfg.train.precision) == ("auto", "fp32")  # the cpu scale unchanged


@pytest.mark.parametrize("name, cfg", [
    ("lego-albert", lego_pool.variant("gpu", "albert", layers=12)),
    ("lego-mimic", lego_pool.variant("gpu", "mimic").with_overrides(["train.mimic_steps=2"])),
    ("composite-depth5", composite.base_config("gpu").with_overrides(["model.n_layers=5"])),
    ("templates-copy", templates.cell_config("gpu", "copy", 64, augmented=True, d_model=512, n_vars=1)),
])
def test_one_model_of_each_gpu_study_trains_on_the_cpu_once_shrunk(tmp_path, name, cfg):
    Trainer(cfg.with_overrides(SHRINK), tmp_path / name, progress=False).fit()
    last = read_metrics(tmp_path / name)[-1]
    assert last["step"] == 2 and last["eval_loss"] > 0
    if name.startswith("lego"):
        assert len(last["acc_per_var"]) == 12  # #6-#11 are scored: the extrapolation the study reads


@pytest.mark.slow
def test_every_lego_experiment_runs_on_a_plain_base(tmp_path, monkeypatch):
    """Each LEGO study end to end on the gpu scale's plain base, shrunk to d 16 on the CPU (about 2 min)."""
    shrunk = get_preset("lego-gpu").with_overrides(["model.d_model=16", "model.n_heads=4", "model.d_mlp=32", *SHRINK])
    monkeypatch.setattr(lego_pool, "base_config", lambda scale: shrunk)
    results = {study.name: run_study(study.name, tmp_path / study.name, "gpu", progress=False)
               for study in lego.STUDIES}
    pool = tmp_path / "lego-runs-gpu"
    assert read_config(pool / "bert-L12-s1").model.planted == {} and read_config(pool / "hybrid3-s0").model.planted
    headline = results["lego-extrapolation"]["headline"]
    assert all(len(acc) == 12 for acc in results["lego-extrapolation"]["final_acc"].values())
    assert 0 <= headline["albert-L12_unsupervised_mean"] <= 1  # the mean over #6-#11
    heads = results["lego-heads"]["models"]["bert-s0"]
    assert heads["planted"] == {} and len(heads["learned_labels"]) == 8 * 4  # every head counts as learned
