"""The training step on a GPU: members of a stacked ensemble end within float rounding of the same
runs trained alone, the compiled step (a CUDA graph) trains like the eager one, no step between
evaluations waits for the host, and `workbench benchmark --ensemble K --device cuda` measures
every shape."""

import math

import pytest
import torch

from analyses.bench.ensemble import run_ensemble_benchmark
from analyses.bench.throughput import UNWRITTEN, training_stack
from models.runs import verified_weights
from models.train import Trainer, train_runs
from tests.helpers import tiny_composite_run

pytestmark = pytest.mark.gpu


def cuda_run(**train):
    return tiny_composite_run(steps=15, device="cuda", snapshots=0, **train).with_overrides(["model.biases=false"])


def test_members_on_cuda_end_near_the_lone_runs(tmp_path):
    cfgs = {f"s{seed}": cuda_run(seed=seed) for seed in (0, 1, 2)}
    for name, cfg in cfgs.items():
        Trainer(cfg, tmp_path / "alone" / name, progress=False).fit()
    train_runs([Trainer(cfg, tmp_path / "together" / name, progress=False) for name, cfg in cfgs.items()],
               progress=False)
    for name in cfgs:
        ours, _ = verified_weights(tmp_path / "together" / name)
        theirs, _ = verified_weights(tmp_path / "alone" / name)
        assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-3, name


@pytest.mark.parametrize("members", [1, 3])
def test_the_compiled_cuda_step_trains_like_the_eager_one(tmp_path, members):
    """The compiled step replayed as a CUDA graph, lone and stacked, against eager, 15 steps."""
    cfgs = {f"s{seed}": cuda_run(seed=seed) for seed in range(members)}
    for mode in ("eager", "compiled"):
        compile = ["train.compile=true"] if mode == "compiled" else []
        train_runs([Trainer(cfg.with_overrides(compile), tmp_path / mode / name, progress=False)
                    for name, cfg in cfgs.items()], progress=False)
    for name in cfgs:
        ours, _ = verified_weights(tmp_path / "compiled" / name)
        theirs, _ = verified_weights(tmp_path / "eager" / name)
        assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-3, name


@pytest.mark.parametrize("compile", [False, True])
def test_no_training_step_waits_for_the_host(compile):
    """torch.cuda.set_sync_debug_mode("error") raises at any synchronizing call: steps between
    evaluations (drawing batches, the step, the loss sums) make none."""
    runs, stack = training_stack(tiny_composite_run(), torch.device("cuda"), UNWRITTEN, 4, compile)
    for _ in range(3):  # warm-up: compilation and graph capture may sync
        stack.step([run._next_batch() for run in runs], [run.learning_rate() for run in runs])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            stack.step([run._next_batch() for run in runs], [run.learning_rate() for run in runs])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(stack.loss_sum).all()


def test_the_cuda_ensemble_benchmark_measures_every_shape():
    results = run_ensemble_benchmark(4, "cuda", quick=True)
    for shape, numbers in results.items():
        for key in ("lone_eager_member_steps_per_s", "ensemble_eager_member_steps_per_s", "ratio",
                    "ensemble_eager_fraction_of_peak", "ensemble_eager_syncs"):
            assert math.isfinite(numbers[key]) and numbers[key] >= 0, (shape, key)
