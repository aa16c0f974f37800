"""`workbench benchmark --device cuda` on a GPU: every number comes back, positive."""

import math

import pytest
import torch

from analyses.benchmark import run_device_benchmark

pytestmark = pytest.mark.gpu


def test_the_cuda_benchmark_measures_every_number():
    results = run_device_benchmark(torch.device("cuda"), quick=True)
    for key in ("matmul_peak_flops", "train_tokens_per_s", "fraction_of_peak", "data_s_per_batch", "step_s",
                "patching_exact_s", "patching_transformer_lens_s"):
        assert math.isfinite(results[key]) and results[key] > 0, key
    assert results["fraction_of_peak"] < 1.5
    assert results["patching_max_abs_diff"] <= 1e-3  # bf16 is not involved: fp32 sweeps on both sides
