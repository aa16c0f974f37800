"""Ensembles on a GPU: members of a stacked ensemble end within float rounding of the same runs
trained alone on CUDA, and `workbench benchmark --ensemble K --device cuda` measures every shape."""

import math

import pytest
import torch

from analyses.bench.ensemble import run_ensemble_benchmark
from models.ensemble import fit_members
from models.runs import verified_weights
from models.train import Trainer
from tests.helpers import tiny_composite_run

pytestmark = pytest.mark.gpu


def test_members_on_cuda_end_near_the_lone_runs(tmp_path):
    cfgs = {f"s{seed}": tiny_composite_run(steps=15, device="cuda", snapshots=0).with_overrides(
        [f"train.seed={seed}", "model.biases=false"]) for seed in (0, 1, 2)}
    for name, cfg in cfgs.items():
        Trainer(cfg, tmp_path / "alone" / name, progress=False).fit()
    fit_members([Trainer(cfg, tmp_path / "together" / name, progress=False) for name, cfg in cfgs.items()],
                progress=False)
    for name in cfgs:
        ours, _ = verified_weights(tmp_path / "together" / name)
        theirs, _ = verified_weights(tmp_path / "alone" / name)
        assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-3, name


def test_the_cuda_ensemble_benchmark_measures_every_shape():
    results = run_ensemble_benchmark(4, "cuda", quick=True)
    for shape, numbers in results.items():
        for key in ("alone_member_steps_per_s", "ensemble_member_steps_per_s", "ratio", "ensemble_fraction_of_peak"):
            assert math.isfinite(numbers[key]) and numbers[key] > 0, (shape, key)
    assert torch.cuda.is_available()
