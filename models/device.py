"""The training device: which one `train.device` names, deterministic kernels while training,
bf16 support and autocast, and handing a batch to the device."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from tasks import Batch, ConfigError


def resolve_device(name: str, setting: str = "train.device") -> torch.device:
    """The device `name` ("auto", "cpu" or "cuda") stands for; `setting` names where it was asked
    for (`train.device`, `analyze --device`), so the error points at what to change."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{setting}='cuda' but no CUDA device is available (torch.cuda.is_available() is False); "
                          "use --device cpu, or a machine with an NVIDIA GPU and a CUDA build of torch")
    return torch.device(name)


def cuda_deterministic() -> bool:
    """Whether CUDA kernels can be made deterministic: cuBLAS is only when CUBLAS_WORKSPACE_CONFIG
    was set before the process started (":4096:8"), and torch refuses deterministic mode without it."""
    return os.environ.get("CUBLAS_WORKSPACE_CONFIG") in (":4096:8", ":16:8")


@contextmanager
def deterministic_kernels(device: torch.device, tf32: bool = False) -> Iterator[None]:
    """Deterministic kernels while training, so one seed gives the same weights: on the CPU with
    two or more threads the embedding's backward otherwise adds gradient rows in a varying order
    (two 300-step lego-cpu runs on 2 threads differed by 1e-4 in the weights). On CUDA only where
    `cuda_deterministic()`; elsewhere a CUDA run, and a resumed one, match an uninterrupted run
    within float tolerance rather than bit for bit (README, "With a GPU"). With `tf32` (the
    setting train.tf32), CUDA's fp32 matmuls run on TF32 tensor cores (10-bit mantissa inputs).
    The previous settings are restored."""
    before = torch.are_deterministic_algorithms_enabled()
    matmul_before = torch.get_float32_matmul_precision()
    on = device.type == "cpu" or (device.type == "cuda" and cuda_deterministic())
    # warn, not fail, where a CUDA op has no deterministic kernel
    torch.use_deterministic_algorithms(before or on, warn_only=on and device.type == "cuda")
    if tf32 and device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        torch.set_float32_matmul_precision(matmul_before)


def bf16_supported(device: torch.device) -> bool:
    """Whether the device has bf16 matmul kernels (CPU: oneDNN with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def check_precision(device: torch.device, precision: str) -> None:
    if precision == "bf16" and not bf16_supported(device):
        raise ConfigError(f"train.precision='bf16' but this {device.type} device has no bf16 kernels; "
                          "use train.precision=fp32")


def training_precision(device: torch.device, precision: str):
    """bf16 autocast for the forward pass, or nothing for fp32."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A batch sampled on the CPU, on the training device. To a GPU it is pinned and copied
    without waiting: the copy overlaps with the steps already queued there, and the trainer
    samples the next batch on the CPU meanwhile (LEGO n=12, 512 sentences: about 2 ms on one
    core; `workbench benchmark --device cuda` prints it beside a training step). Sampling on the
    CPU also gives a CUDA run the same sequences as a CPU run of the same seed."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)
