"""`workbench benchmark --device`: its parts measured on the CPU with a tiny model, every CUDA
timing synchronised (checked with CUDA mocked), and `--device cuda` refused without CUDA. The
whole CPU run is in the slow suite; tests/gpu/ runs it on CUDA."""

import math

import pytest
import torch

from analyses.bench import throughput as benchmark
from analyses.cli import main
from tests.helpers import tiny_lego_run

CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def test_cuda_timings_wait_for_the_device(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    benchmark.best_time(lambda: None, repeats=3, device=CUDA)
    assert len(waits) == 4  # once before, then after each run
    waits.clear()
    assert benchmark.timed(lambda: 7, CUDA)[0] == 7
    assert len(waits) == 2  # before and after
    waits.clear()
    benchmark.best_time(lambda: None, repeats=3)
    benchmark.timed(lambda: None)
    assert waits == []


def test_modes_the_device_cannot_run_are_skipped_saying_why(monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "bf16_supported", lambda device: False)
    monkeypatch.setattr("models.train.shutil.which", lambda name: None)
    assert list(benchmark.runnable_modes(torch.device("cpu"))) == ["eager fp32"]
    out = capsys.readouterr().out
    assert "bf16 modes skipped: this cpu device has no bf16" in out
    assert "compiled steps skipped" in out and "C++ compiler" in out


def test_training_modes_give_steps_and_tokens_per_second(monkeypatch):
    monkeypatch.setattr(benchmark, "runnable_modes", lambda device: {"eager fp32": (False, "fp32")})
    rates = benchmark.training_modes((16,), repeats=1, cfg=tiny_lego_run())
    _, _, tokens = benchmark.training_step_fn(tiny_lego_run(), 16, count_flops=False)
    assert rates["tokens_per_s_eager_fp32_b16"] == pytest.approx(rates["steps_per_s_eager_fp32_b16"] * tokens)


def test_the_fraction_of_peak_is_each_modes_flops_over_the_peak():
    rates = {"steps_per_s_eager_fp32_b16": 2.0, "steps_per_s_compiled_fp32_b16": 5.0}
    found = benchmark.fractions_of_peak(tiny_lego_run(), 16, torch.device("cpu"), rates, peak=1e12, peak_dtype="fp32")
    flops = found["train_flops_per_step"]
    assert flops > 0
    assert found["fraction_of_peak_eager_fp32_b16"] == pytest.approx(2 * flops / 1e12)
    assert found["fraction_of_peak"] == pytest.approx(5 * flops / 1e12)  # the best mode's
    assert found["train_steps_per_s"] == 5.0


def test_data_step_and_patching_times_are_measured_side_by_side():
    cfg = tiny_lego_run()
    times = benchmark.data_and_step_times(cfg, 16, torch.device("cpu"), repeats=2)
    assert 0 < times["data_s_per_batch"] < times["step_s"]  # a tiny batch samples faster than a step runs
    assert times["step_with_data_s"] > 0
    patched = benchmark.patching_times(cfg, torch.device("cpu"), n_pairs=4, repeats=2)
    assert patched["patching_max_abs_diff"] <= 1e-4  # the same sweep as TransformerLens's
    assert patched["patching_speedup_vs_transformer_lens"] == pytest.approx(
        patched["patching_transformer_lens_s"] / patched["patching_exact_s"])
    peak = benchmark.matmul_peak(256, repeats=2)
    assert math.isfinite(peak) and peak > 1e8


@pytest.mark.parametrize(("step_with_data", "verdict"), [(0.0102, "does not wait"), (0.02, "waits for data")])
def test_on_cuda_the_gpu_waits_when_sampling_slows_the_steps(capsys, step_with_data, verdict):
    times = {"data_s_per_batch": 0.002, "step_s": 0.01, "step_with_data_s": step_with_data}
    benchmark.print_data_wait(times, 512, "eager bf16", CUDA)
    assert verdict in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_benchmark_on_cuda_without_a_gpu_exits_2_naming_cuda(capsys):
    assert main(["benchmark", "--device", "cuda", "--quick"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_benchmark_refuses_patching_with_a_device(tmp_path, capsys):
    assert main(["benchmark", "--patching", str(tmp_path), "--device", "cpu"]) == 2
    assert "drop --device cpu" in capsys.readouterr().err


@pytest.mark.slow
def test_the_device_benchmark_runs_on_the_cpu():
    results = benchmark.run_device_benchmark(torch.device("cpu"), quick=True)
    for key in ("matmul_peak_flops", "steps_per_s_eager_fp32_b8", "tokens_per_s_eager_fp32_b8",
                "fraction_of_peak_eager_fp32_b8", "train_flops_per_step", "train_tokens_per_s", "fraction_of_peak",
                "data_s_per_batch", "step_s", "step_with_data_s", "patching_exact_s", "patching_transformer_lens_s"):
        assert math.isfinite(results[key]) and results[key] > 0, key
    assert 0 < results["fraction_of_peak"] < 1.5
    assert results["patching_max_abs_diff"] <= 1e-4
