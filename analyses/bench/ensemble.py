"""`workbench benchmark --ensemble K`: K members of one shape trained one after another, and the
same K as one stacked ensemble (models/ensemble.py), side by side in one run, so the ratio holds
on a loaded machine too.

Each member is a real `Trainer` (fresh folder, nothing written): one after another, each member's
step is `Trainer._train_step` on its own next batch, as a lone run steps; together, one
`StackedStepper` step over all K batches. Printed per shape: member-steps/s both ways, the ratio
(ensemble / one after another; >= 1.0 means the ensemble is at least as fast), and the achieved
FLOP/s of both as a fraction of a matmul peak measured in the same run (one member step's FLOPs
counted by FlopCounterMode).

Timed: the best of `repeats` rounds of `steps` steps each way, the two ways interleaved, after one
warm-up round (CPU: 4 rounds of 2 steps, so that K = 12 takes minutes; CUDA: 5 of 3).

Shapes: composite-matched (the composite-cpu width, bias-free: the matched phase diagram's cells)
and lego-cpu at their own batch sizes; composite-paper and lego-gpu at their own batch sizes on
CUDA, and at batch `CPU_BIG_BATCH` on the CPU (a batch-2048 step of composite-paper takes
seconds there), and only up to K = 4. Every shape is timed in fp32 eager, the only mode an
ensemble trains in (docs/ensembles.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import interp.tasks  # noqa: F401  (registers the presets named below)
from analyses.bench.throughput import best_time, matmul_peak, peak_matmul
from models.device import deterministic_kernels
from models.ensemble import StackedStepper
from models.presets import get_preset
from models.train import Trainer, resolve_device

CPU_BIG_BATCH = 16
CPU_BIG_MAX_K = 4  # the GPU shapes on the CPU only up to this K: beyond, minutes per shape


def ensemble_shapes(device: torch.device, k: int, quick: bool = False) -> dict:
    """The shapes to time on `device`, as configs; the GPU shapes at a cut batch on the CPU, and
    there only up to K = CPU_BIG_MAX_K."""
    shapes = {name: get_preset(name) for name in ("composite-matched", "lego-cpu")}
    if device.type == "cpu" and k > CPU_BIG_MAX_K and not quick:
        print(f"composite-paper and lego-gpu: not timed on the CPU at K > {CPU_BIG_MAX_K} (minutes per shape); "
              f"`--device cuda` times them at their own batch sizes")
        return shapes
    big = {name: get_preset(name) for name in ("composite-paper", "lego-gpu")}
    for name, cfg in big.items():
        cut = [] if device.type == "cuda" else [f"train.batch_size={CPU_BIG_BATCH}"]
        shapes[name] = cfg.with_overrides(["train.precision=fp32", "train.n_train=null", *cut])
    if quick:  # a test of the command's shape: tiny batches, the small shapes only
        shapes = {name: shapes[name].with_overrides(["train.batch_size=4"])
                  for name in ("composite-matched", "lego-cpu")}
    return shapes


def _members(cfg, k: int, device: torch.device, root: Path) -> list[Trainer]:
    """K trainers of `cfg` differing in seed and init scale, on `device`, in fresh folders."""
    overrides = [f"train.device={device.type}", "train.eval_size=64", "train.snapshots=0", "train.mimic_steps=0",
                 "train.plateau_evals=null", "train.plateau_min_steps=0", "train.plateau_watch=[]"]
    gammas = [0.5, 0.7, 0.9, 1.0]
    members = []
    for index in range(k):
        member = cfg.with_overrides([*overrides, f"train.seed={index}", f"model.init_gamma={gammas[index % 4]}"])
        members.append(Trainer(member, root / f"m{index}", progress=False))
    return members


def time_shape(cfg, k: int, device: torch.device, steps: int, repeats: int) -> dict[str, float]:
    """Seconds per round (every member one step) one after another and as one ensemble, and one
    member step's FLOPs."""
    with tempfile.TemporaryDirectory() as tmp:
        alone = _members(cfg, k, device, Path(tmp) / "alone")
        together = _members(cfg, k, device, Path(tmp) / "together")
        stepper = StackedStepper(together)

        def one_after_another() -> None:
            for _ in range(steps):
                for member in alone:
                    member._train_step(member._next_batch())
                    member.step += 1

        def as_ensemble() -> None:
            for _ in range(steps):
                stepper.step([member._next_batch() for member in together])

        one_after_another(), as_ensemble()  # warm-up: first-call allocations, vmap's tracing
        with FlopCounterMode(display=False) as counter:
            alone[0]._train_step(alone[0]._next_batch())
        # interleaved, the best of each: a load that comes and goes touches both ways alike
        alone_s, together_s = [], []
        for _ in range(repeats):
            alone_s.append(best_time(one_after_another, 1, device))
            together_s.append(best_time(as_ensemble, 1, device))
        return {"alone_s": min(alone_s) / steps, "ensemble_s": min(together_s) / steps,
                "flops_per_member_step": counter.get_total_flops()}


def run_ensemble_benchmark(k: int, device_name: str = "cpu", quick: bool = False) -> dict[str, dict[str, float]]:
    """Time every shape of `ensemble_shapes` with `k` members; print and return the numbers."""
    if k < 1:
        raise ValueError(f"--ensemble {k}: K must be >= 1")
    device = resolve_device(device_name, setting="benchmark --device")
    torch.set_flush_denormal(True)  # as the trainer does (models/ensemble.py, fit_members)
    cuda = device.type == "cuda"
    # the GPU's bf16 peak (what the figures are against); the CPU's fp32 one, the ensemble's precision
    dtype, size = peak_matmul(device) if cuda else (torch.float32, 1024)
    steps, repeats = (2, 2) if quick else (2, 4) if not cuda else (3, 5)
    name = torch.cuda.get_device_name(device) if cuda else f"{torch.get_num_threads()} CPU threads"
    peak = matmul_peak(size if not quick else 256, 3 if quick else 20, device, dtype)
    label = "bf16" if dtype == torch.bfloat16 else "fp32"
    print(f"ensemble benchmark: K={k} on {device} ({name}); {label} matmul peak measured now: "
          f"{peak / 1e9:,.1f} GFLOP/s ({size}x{size})")
    results = {}
    for shape, cfg in ensemble_shapes(device, k, quick).items():
        with deterministic_kernels(device):  # as the trainer trains (models/device.py)
            timing = time_shape(cfg, k, device, steps, repeats)
        alone_rate, together_rate = k / timing["alone_s"], k / timing["ensemble_s"]
        flops = timing["flops_per_member_step"]
        results[shape] = {**timing, "members": k, "batch_size": cfg.train.batch_size,
                          "alone_member_steps_per_s": alone_rate, "ensemble_member_steps_per_s": together_rate,
                          "ratio": together_rate / alone_rate, "alone_fraction_of_peak": alone_rate * flops / peak,
                          "ensemble_fraction_of_peak": together_rate * flops / peak}
        r = results[shape]
        print(f"{shape} (batch {cfg.train.batch_size}, fp32 eager), K={k}: one after another "
              f"{alone_rate:.2f} member-steps/s ({r['alone_fraction_of_peak']:.1%} of the {label} peak), ensemble "
              f"{together_rate:.2f} member-steps/s ({r['ensemble_fraction_of_peak']:.1%}); ratio {r['ratio']:.2f}")
    return results
