"""The CUDA code paths that a machine without a GPU can exercise: device selection, where batches
are made and how they reach the device, autocast, deterministic kernels and the Ray sweep's GPU
share, with CUDA mocked where it must be present. tests/gpu/ runs the same paths on a real GPU."""

import sys
import types
import warnings

import pytest
import torch

from models.device import cuda_deterministic, deterministic_kernels, resolve_device, to_device, training_precision
from tasks import ConfigError, LegoConfig, make_task, seeded_generator

CUDA = torch.device("cuda")


@pytest.fixture
def batch():
    return make_task(LegoConfig(n_vars=4, n_supervised=2)).sample(8, seeded_generator(0))


def test_auto_picks_cuda_when_present_and_cuda_is_refused_when_absent(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == CUDA and resolve_device("cuda") == CUDA
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda")


def test_batches_for_a_gpu_are_pinned_then_copied_without_waiting(batch, monkeypatch):
    """The trainer samples on the CPU (its generators are CPU generators, so a CUDA run sees a
    CPU run's sequences) and hands the GPU a pinned batch with a non-blocking copy."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append("pin") or t.clone())
    real_to = torch.Tensor.to

    def fake_to(t, device, non_blocking=False):
        calls.append(("to", torch.device(device).type, non_blocking))
        return real_to(t, "cpu")

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    moved = to_device(batch, CUDA)
    n = 5 + len(batch.latents)  # five fields and the latents
    assert calls == ["pin"] * n + [("to", "cuda", True)] * n
    assert torch.equal(moved.tokens, batch.tokens) and moved.latents.keys() == batch.latents.keys()
    calls.clear()
    to_device(batch, torch.device("cpu"))
    assert "pin" not in calls and all(not c[2] for c in calls)  # no pinning without a GPU


def test_bf16_autocasts_on_the_training_device_and_fp32_does_not_autocast():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available, disabling": the context is still built for cuda
        bf16 = training_precision(CUDA, "bf16")
    assert isinstance(bf16, torch.autocast) and bf16.device == "cuda" and bf16.fast_dtype == torch.bfloat16
    cpu = training_precision(torch.device("cpu"), "bf16")
    assert cpu.device == "cpu" and cpu.fast_dtype == torch.bfloat16
    assert not isinstance(training_precision(CUDA, "fp32"), torch.autocast)


@pytest.mark.parametrize("config, deterministic", [(None, False), (":4096:8", True), (":16:8", True), ("junk", False)])
def test_cuda_kernels_are_deterministic_only_with_a_cublas_workspace_config(monkeypatch, config, deterministic):
    if config is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    assert cuda_deterministic() is deterministic
    with deterministic_kernels(CUDA):
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert torch.is_deterministic_algorithms_warn_only_enabled() is deterministic
    with deterministic_kernels(torch.device("cpu")):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_ray_cells_share_the_clusters_gpus_among_the_workers(monkeypatch, tmp_path):
    """Each Ray cell asks for its share of the GPUs (none without GPUs, so Ray hides them and the
    cell's `auto` device is the CPU). A stand-in `ray` module records what is asked for."""
    from analyses.runners.ray_backend import gpu_share
    from analyses.runners.sweep import run_cells
    from tests.helpers import tiny_composite_run

    assert gpu_share(0, 4) == 0 and gpu_share(1, 2) == 0.5 and gpu_share(1, 1) == 1.0 and gpu_share(4, 2) == 1.0

    asked = []

    class Remote:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args):
            return Ref(self.fn(*args))  # run at once; the "ref" holds the result

    class Ref:
        def __init__(self, value):
            self.value = value

    fake = types.SimpleNamespace(
        is_initialized=lambda: False, init=lambda **kw: None, shutdown=lambda: None,
        cluster_resources=lambda: {"CPU": 2.0, "GPU": 1.0},
        remote=lambda **options: asked.append(options) or Remote,
        wait=lambda pending, num_returns: (pending[:1], pending[1:]), get=lambda ref: ref.value)
    monkeypatch.setitem(sys.modules, "ray", fake)
    results = run_cells({"a": tiny_composite_run(steps=4)}, tmp_path, workers=2, backend="ray", progress=False)
    assert asked == [{"num_cpus": 1, "num_gpus": 0.5, "max_retries": 0}]
    assert results["a"].status == "done"
