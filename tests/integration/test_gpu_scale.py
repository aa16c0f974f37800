"""The `gpu` scale of every study: its configs are valid, the LEGO models are plain (nothing
planted) on the paper's n = 12 task, and one model of each study trains on the CPU once shrunk,
so that a GPU user's first run does not fail on a shape."""

import pytest

from analyses.studies import composite, lego, templates
from analyses.study import SCALES
from analyses.sweep import grid_cells
from models.runs import read_metrics
from models.train import Trainer

SHRINK = ["train.device=\"cpu\"", "train.precision=\"fp32\"", "train.steps=2", "train.batch_size=4", "train.eval_every=2",
          "train.eval_size=16", "train.checkpoint_every=2", "train.warmup_steps=1", "train.plateau_evals=null"]
LEGO_KINDS = ("bert", "albert", "albert-sd", "standard", "mimic", "hardcoded", "hybrid3")


def test_gpu_sits_between_cpu_and_paper():
    assert SCALES.index("cpu") < SCALES.index("gpu") < SCALES.index("paper")


def test_lego_gpu_models_are_plain_on_the_papers_task_with_two_seeds():
    for kind in LEGO_KINDS:
        for layers in lego.depths("gpu"):
            cfg = lego.variant("gpu", kind, seed=1, layers=layers)
            assert (cfg.task.n_vars, cfg.task.n_supervised, cfg.model.n_layers) == (12, 6, layers)
            assert (cfg.model.planted == {}) is (kind not in ("hardcoded", "hybrid3"))
            assert cfg.train.precision == "bf16" and cfg.train.device == "cuda"
    assert lego.variant("gpu", "bert") == lego.variant("gpu", "standard")  # plain: the same recipe
    assert lego.variant("gpu", "albert").model.tie_layers
    assert lego.variant("gpu", "mimic").train.mimic_steps == 1000
    assert max(lego.depths("gpu")) == 12  # room to extrapolate to #6-#11


def test_composite_gpu_cells_use_the_papers_width_and_post_ln():
    cells = grid_cells(composite.base_config("gpu"), composite.phase_grid("gpu"))
    assert len(cells) == 2 * 4 * 4
    for cfg in cells.values():
        assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.d_head, cfg.model.d_mlp) == (400, 1, 200, 1200)
        assert cfg.model.norm_position == "post" and cfg.train.batch_size == 2048
    assert {c.model.init_gamma for c in composite.contrast_cells("gpu").values()} == {0.5, 0.8}
    assert len(grid_cells(composite.lr_wd_base("gpu"), composite.lr_wd_grid("gpu"))) == 12


def test_templates_gpu_scale_lies_between_cpu_and_paper():
    gpu, cpu, paper = (templates.SCALES[s] for s in ("gpu", "cpu", "paper"))
    assert cpu["steps"] < gpu["steps"] < paper["steps"] and cpu["d_model"] < gpu["d_model"] < paper["d_model"]
    cfg = templates.cell_config("gpu", "same_different", 4096, augmented=True)
    assert cfg.task.n_train_symbols == 4096 and cfg.model.identity_attention and cfg.model.d_model == 256


@pytest.mark.parametrize("name, cfg", [
    ("lego-albert", lego.variant("gpu", "albert", layers=12)),
    ("lego-mimic", lego.variant("gpu", "mimic").with_overrides(["train.mimic_steps=2"])),
    ("composite-depth5", composite.base_config("gpu").with_overrides(["model.n_layers=5"])),
    ("templates-copy", templates.cell_config("gpu", "copy", 64, augmented=True, d_model=512, n_vars=1)),
])
def test_one_model_of_each_gpu_study_trains_on_the_cpu_once_shrunk(tmp_path, name, cfg):
    Trainer(cfg.with_overrides(SHRINK), tmp_path / name, progress=False).fit()
    last = read_metrics(tmp_path / name)[-1]
    assert last["step"] == 2 and last["eval_loss"] > 0
    if name.startswith("lego"):
        assert len(last["acc_per_var"]) == 12  # #6-#11 are scored: the extrapolation the study reads
