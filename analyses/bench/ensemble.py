"""`workbench benchmark --ensemble K`: where a training step's time goes, per shape, side by side in
one run (so the ratios hold on a loaded machine too):

- lone eager: one run's step, eager (the trainer's stack of one, models/step.py);
- lone compiled: the same step through torch.compile (on CUDA, replayed as a CUDA graph);
- ensemble compiled: K runs (seeds and init scales differ) as one stacked step, compiled.

Printed per shape: member-steps/s of each, the ratio of the compiled ensemble to compiled lone
runs (>= 1.0: training K together is at least as fast as one after another), the achieved FLOP/s
as a fraction of a matmul peak measured in the same run (one member step's FLOPs counted by
FlopCounterMode), and on CUDA the kernel launches and host syncs per step (torch.profiler).
Each step includes drawing the members' batches on the host, as in training.

Timed: the best of `repeats` rounds of `steps` steps each way, the ways interleaved, after the
warm-up (compilation: tens of seconds per graph on a CPU). Where torch.compile cannot run (no C++
compiler on a CPU), the compiled columns are skipped and the eager ensemble is timed instead.

Shapes: composite-matched and lego-cpu at their own batch sizes; composite-paper and lego-gpu at
their own batch sizes on CUDA, at batch `CPU_BIG_BATCH` on the CPU and there only up to K = 4.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import interp.tasks  # noqa: F401  (registers the presets named below)
from analyses.bench.throughput import (
    UNWRITTEN,
    best_time,
    compiles_here,
    matmul_peak,
    peak_matmul,
    step_flops,
    training_stack,
)
from models.device import deterministic_kernels, resolve_device
from models.presets import get_preset
from tasks import ConfigError

CPU_BIG_BATCH = 16
CPU_BIG_MAX_K = 4  # the GPU shapes on the CPU only up to this K: beyond, minutes per shape
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def ensemble_shapes(device: torch.device, k: int, quick: bool = False) -> dict:
    """The shapes to time on `device`, as configs; the GPU shapes at a cut batch on the CPU, and
    there only up to K = CPU_BIG_MAX_K."""
    shapes = {name: get_preset(name) for name in ("composite-matched", "lego-cpu")}
    if quick:  # a test of the command's shape: tiny batches, the small shapes only
        return {name: cfg.with_overrides(["train.batch_size=4"]) for name, cfg in shapes.items()}
    if device.type == "cpu" and k > CPU_BIG_MAX_K:
        print(f"composite-paper and lego-gpu: not timed on the CPU at K > {CPU_BIG_MAX_K} (minutes per shape); "
              f"`--device cuda` times them at their own batch sizes")
        return shapes
    for name in ("composite-paper", "lego-gpu"):
        cut = [] if device.type == "cuda" else [f"train.batch_size={CPU_BIG_BATCH}"]
        shapes[name] = get_preset(name).with_overrides(["train.precision=fp32", "train.n_train=null", *cut])
    return shapes


def stepper(cfg, k: int, device: torch.device, compile: bool) -> Callable[[], None]:
    """One training step of K runs of `cfg` as one stack, batches drawn as the loop draws them."""
    runs, stack = training_stack(cfg, device, UNWRITTEN, k, compile)

    def step() -> None:
        stack.step([run._next_batch() for run in runs], [run.learning_rate() for run in runs])

    return step


def launches_and_syncs(step: Callable[[], None], steps: int) -> tuple[float, float]:
    """CUDA kernel launches (a CUDA graph's replay counts one) and host syncs per step, from the
    profiler's CUDA runtime events."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    counts = {e.key: e.count for e in prof.key_averages()}
    launches = sum(counts.get(name, 0) for name in LAUNCHES)
    syncs = sum(counts.get(name, 0) for name in SYNCS) - 1  # less the synchronize that ends the profile
    return launches / steps, max(syncs, 0) / steps


def time_shape(cfg, k: int, device: torch.device, steps: int, repeats: int, compiles: bool) -> dict[str, float]:
    """Seconds per member step: lone eager, lone compiled and the K-member ensemble compiled (eager
    where nothing compiles); one member step's FLOPs; on CUDA launches and syncs per step."""
    ways = {"lone_eager": (1, False), "lone_compiled": (1, True), "ensemble_compiled": (k, True)}
    if not compiles:
        ways = {"lone_eager": (1, False), "ensemble_eager": (k, False)}
    # every stack built before any is compiled: building a compiled one clears dynamo's caches
    steppers = {way: stepper(cfg, members, device, compiled) for way, (members, compiled) in ways.items()}
    for step in steppers.values():
        step(), step()  # warm-up: compilation, CUDA graph capture, first allocations
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(repeats):  # interleaved, the best of each: a passing load touches every way alike
        for way, step in steppers.items():
            seconds[way].append(best_time(lambda step=step: [step() for _ in range(steps)], 1, device) / steps)
    result = {f"{way}_s": min(values) / ways[way][0] for way, values in seconds.items()}
    result["flops_per_member_step"] = step_flops(cfg, device)
    if device.type == "cuda":
        for way, step in steppers.items():
            result[f"{way}_launches"], result[f"{way}_syncs"] = launches_and_syncs(step, steps)
    return result


def run_ensemble_benchmark(k: int, device_name: str = "cpu", quick: bool = False,
                           only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Time every shape of `ensemble_shapes` (or those named in `only`) with `k` members; print
    and return the numbers."""
    if k < 1:
        raise ConfigError(f"--ensemble {k}: K must be >= 1")
    known = ("composite-matched", "lego-cpu", "composite-paper", "lego-gpu")
    unknown = [name for name in only or [] if name not in known]
    if unknown:
        raise ConfigError(f"--shapes {','.join(unknown)}: unknown; choose from {','.join(known)}")
    device = resolve_device(device_name, setting="benchmark --device")
    torch.set_flush_denormal(True)  # as the trainer does
    cuda = device.type == "cuda"
    compiles = compiles_here(device) and not quick
    if quick:
        print("compiled steps skipped: --quick (compilation alone takes tens of seconds a graph)")
    # the GPU's bf16 peak (what the paper-scale targets are against); the CPU's fp32 one
    dtype, size = peak_matmul(device) if cuda else (torch.float32, 1024)
    steps, repeats = (2, 2) if quick else (2, 3) if not cuda else (10, 5)
    name = torch.cuda.get_device_name(device) if cuda else f"{torch.get_num_threads()} CPU threads"
    peak = matmul_peak(size if not quick else 256, 3 if quick else 20, device, dtype)
    label = "bf16" if dtype == torch.bfloat16 else "fp32"
    print(f"ensemble benchmark: K={k} on {device} ({name}); {label} matmul peak measured now: "
          f"{peak / 1e9:,.1f} GFLOP/s ({size}x{size})")
    results = {}
    shapes = ensemble_shapes(device, k if not only else 1, quick)
    for shape, cfg in {n: c for n, c in shapes.items() if only is None or n in only}.items():
        with deterministic_kernels(device):  # as the trainer trains (models/device.py)
            timing = time_shape(cfg, k, device, steps, repeats, compiles)
        flops = timing["flops_per_member_step"]
        rates = {key[:-2]: 1 / value for key, value in timing.items() if key.endswith("_s")}
        together = rates.get("ensemble_compiled", rates.get("ensemble_eager"))
        alone = rates.get("lone_compiled", rates["lone_eager"])
        results[shape] = {**timing, "members": k, "batch_size": cfg.train.batch_size, "ratio": together / alone,
                          **{f"{way}_member_steps_per_s": rate for way, rate in rates.items()},
                          **{f"{way}_fraction_of_peak": rate * flops / peak for way, rate in rates.items()}}
        cells = "; ".join(f"{way.replace('_', ' ')} {rate:,.1f} ({rate * flops / peak:.1%} of peak"
                          + (f", {timing[way + '_launches']:.0f} launches, {timing[way + '_syncs']:.1f} syncs"
                             if cuda else "") + ")" for way, rate in rates.items())
        print(f"{shape} (batch {cfg.train.batch_size}, fp32), member-steps/s, K={k}: {cells}; "
              f"ensemble / lone: {together / alone:.2f}")
    return results
