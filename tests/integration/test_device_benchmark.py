"""`workbench benchmark --device`: its parts measured on the CPU with a tiny model, every CUDA
timing synchronised (checked with CUDA mocked), and `--device cuda` refused without CUDA. The
whole CPU run is in the slow suite; tests/gpu/ runs it on CUDA."""

import math

import pytest
import torch

from analyses import benchmark
from analyses.cli import main
from tests.helpers import tiny_lego_run


def test_cuda_timings_wait_for_the_device(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    benchmark.best_time(lambda: None, repeats=3, device=torch.device("cuda"))
    assert len(waits) == 4  # once before, then after each run
    waits.clear()
    benchmark.best_time(lambda: None, repeats=3)
    assert waits == []


def test_data_step_and_patching_times_are_measured_side_by_side():
    cfg = tiny_lego_run()
    data, step = benchmark.data_and_step_times(cfg, 16, torch.device("cpu"), repeats=2)
    assert 0 < data < step  # a tiny batch samples faster than a training step runs
    patched = benchmark.patching_times(cfg, torch.device("cpu"), n_pairs=4, repeats=1)
    assert patched["patching_max_abs_diff"] <= 1e-4  # the same sweep as TransformerLens's
    assert patched["patching_speedup_vs_transformer_lens"] == pytest.approx(
        patched["patching_transformer_lens_s"] / patched["patching_exact_s"])
    peak = benchmark.matmul_peak(256, repeats=2)
    assert math.isfinite(peak) and peak > 1e8


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_benchmark_on_cuda_without_a_gpu_exits_2_naming_cuda(capsys):
    assert main(["benchmark", "--device", "cuda", "--quick"]) == 2
    assert "CUDA" in capsys.readouterr().err


@pytest.mark.slow
def test_the_device_benchmark_runs_on_the_cpu():
    results = benchmark.run_device_benchmark(torch.device("cpu"), quick=True)
    assert 0 < results["fraction_of_peak"] < 1.5
    assert results["train_tokens_per_s"] > 0 and results["steps_per_s_eager_fp32_b8"] > 0
    assert results["patching_max_abs_diff"] <= 1e-4
