"""`workbench benchmark --device cuda` on a GPU: every number comes back, positive."""

import math

import pytest
import torch

from analyses.bench.throughput import run_device_benchmark

pytestmark = pytest.mark.gpu


def test_the_cuda_benchmark_measures_every_number():
    results = run_device_benchmark(torch.device("cuda"), quick=True)
    modes = ["eager_fp32", "compiled_fp32"] + (["eager_bf16", "compiled_bf16"] if torch.cuda.is_bf16_supported()
                                               else [])
    for key in ["matmul_peak_flops", "train_flops_per_step", "train_tokens_per_s", "fraction_of_peak",
                "data_s_per_batch", "step_s", "step_with_data_s", "patching_exact_s", "patching_transformer_lens_s",
                *(f"{kind}_{mode}_b512" for mode in modes
                  for kind in ("steps_per_s", "tokens_per_s", "fraction_of_peak"))]:
        assert math.isfinite(results[key]) and results[key] > 0, key
    assert results["fraction_of_peak"] < 1.5
    assert results["patching_max_abs_diff"] <= 1e-3  # bf16 is not involved: fp32 sweeps on both sides
