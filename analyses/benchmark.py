"""`workbench benchmark`: numbers measured side by side in one run, so that ratios (not absolute
times on a noisy machine) carry the message.

- task generation rate (sentences/s) for LEGO n=12 and composite;
- training throughput of the lego-cpu model (tokens/s) and its achieved FLOP/s as a fraction of
  a float32 matmul peak measured in the same run (FLOPs counted by torch's FlopCounterMode);
- training steps/s of the lego-cpu shape (planted heads removed) at batch 128 and 512 in the four
  modes `train.compile` x `train.precision` offers, each timed after its own warm-up;
- the denormal slowdown at large init (composite, gamma 0.3) with and without flush-to-zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from analyses.bench_patching import best_times
from models.factory import build_model, forward
from models.presets import composite_cpu, lego_cpu
from models.train import bf16_supported, compiled_forward, supervised_loss, training_precision
from tasks import CompositeConfig, LegoConfig, make_task, seeded_generator


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs, in wall-clock seconds (the least disturbed by other processes)."""
    return best_times(fn, repeats)[0]


def generation_rate(task_cfg, n: int, repeats: int) -> float:
    task, gen = make_task(task_cfg), seeded_generator(0)
    return n / best_time(lambda: task.sample(n, gen), repeats)


def matmul_peak(size: int = 1024, repeats: int = 20) -> float:
    """float32 FLOP/s of a square matmul on this machine, now."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    return 2 * size**3 / best_time(lambda: a @ b, repeats)


def training_step_fn(cfg, batch_size: int, compile: bool = False, precision: str = "fp32",
                     count_flops: bool = True) -> tuple[Callable[[], None], int, int]:
    """A closure doing one full training step as the trainer does it (compiled or eager, fp32 or
    bf16 autocast), its FLOP count (0 unless `count_flops`) and tokens per step. The first call
    (compilation, for a compiled step) happens here."""
    task = make_task(cfg.task)
    model = build_model(cfg.model, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = task.sample(batch_size, seeded_generator(0))
    run_forward = compiled_forward() if compile else forward
    device = torch.device("cpu")

    def step() -> None:
        with training_precision(device, precision):
            logits = run_forward(model, batch.tokens, None)
        loss = supervised_loss(logits.float(), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()
    if not count_flops:
        return step, 0, batch.tokens.numel()
    with FlopCounterMode(display=False) as counter:
        step()
    return step, counter.get_total_flops(), batch.tokens.numel()


TRAINING_MODES = {"eager fp32": (False, "fp32"), "eager bf16": (False, "bf16"),
                  "compiled fp32": (True, "fp32"), "compiled bf16": (True, "bf16")}


def training_modes(batch_sizes: tuple[int, ...], repeats: int) -> dict[str, float]:
    """Steps/s of the lego-cpu shape without planted heads in each training mode, side by side
    (each the best of `repeats` timings of a few steps); modes this CPU cannot run are skipped."""
    cfg = lego_cpu().with_overrides(["model.planted={}"])
    bf16 = bf16_supported(torch.device("cpu"))
    results: dict[str, float] = {}
    for batch_size in batch_sizes:
        rates = {}
        for name, (compiled, precision) in TRAINING_MODES.items():
            if precision == "bf16" and not bf16:
                continue
            step, _, _ = training_step_fn(cfg, batch_size, compiled, precision, count_flops=False)
            rates[name] = 3 / best_time(lambda step=step: [step() for _ in range(3)], repeats)
            results[f"steps_per_s_{name.replace(' ', '_')}_b{batch_size}"] = rates[name]
        eager = rates["eager fp32"]
        cells = ", ".join(f"{name} {rate:.2f} (x{rate / eager:.2f})" for name, rate in rates.items())
        print(f"training modes (lego-cpu shape, no planted heads, batch {batch_size}), steps/s: {cells}")
    if not bf16:
        print("  bf16 modes skipped: this CPU has no bf16 matmul kernels (AVX512-BF16 or AMX); "
              "train.precision=bf16 is refused here")
    return results


def denormal_step_rate(flush: bool, warm_steps: int, timed_steps: int) -> float:
    """Training steps/s of the composite-cpu model at gamma 0.3, measured after `warm_steps`
    (the slowdown appears once weights and moments have shrunk)."""
    cfg = composite_cpu().with_overrides(["model.init_gamma=0.3"])
    task = make_task(cfg.task)
    model = build_model(cfg.model, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    gen = seeded_generator(0)
    torch.set_flush_denormal(flush)
    for i in range(warm_steps + timed_steps):
        if i == warm_steps:
            start = time.perf_counter()
        batch = task.sample(cfg.train.batch_size, gen)
        loss = supervised_loss(forward(model, batch.tokens), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return timed_steps / (time.perf_counter() - start)


def run_benchmarks(quick: bool = False) -> dict[str, float]:
    repeats = 2 if quick else 5
    n = 10_000 if quick else 100_000
    results = {
        "lego12_sentences_per_s": generation_rate(LegoConfig(n_vars=12, n_supervised=6), n, repeats),
        "composite_sequences_per_s": generation_rate(CompositeConfig(), n, repeats),
    }
    print(f"task generation  LEGO n=12: {results['lego12_sentences_per_s']:,.0f} sentences/s (target >= 100,000)")
    print(f"task generation  composite: {results['composite_sequences_per_s']:,.0f} sequences/s")

    cfg = lego_cpu()
    step, flops, tokens = training_step_fn(cfg, cfg.train.batch_size)
    peak = matmul_peak(repeats=5 if quick else 20)
    seconds = best_time(step, 3 if quick else 10)
    results.update(train_tokens_per_s=tokens / seconds, train_flops_per_s=flops / seconds, matmul_peak_flops=peak)
    print(f"training (lego-cpu, batch {cfg.train.batch_size}): {tokens / seconds:,.0f} tokens/s, "
          f"{1 / seconds:.1f} steps/s, {flops / 1e6:.1f} MFLOP/step")
    print(f"achieved {flops / seconds / 1e9:.2f} GFLOP/s = {flops / seconds / peak:.1%} of the float32 matmul "
          f"peak measured now ({peak / 1e9:.1f} GFLOP/s, 1024x1024)")

    results.update(training_modes((128,) if quick else (128, 512), repeats=2 if quick else 5))

    warm, timed = (50, 20) if quick else (400, 100)
    slow, fast = denormal_step_rate(False, warm, timed), denormal_step_rate(True, warm, timed)
    results.update(denormal_off_steps_per_s=slow, denormal_flush_steps_per_s=fast)
    print(f"large init (composite-cpu, gamma 0.3, after {warm} steps): {slow:.1f} steps/s without flush-to-zero, "
          f"{fast:.1f} with it (x{fast / slow:.2f}); the trainer always flushes")
    return results
