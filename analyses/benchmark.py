"""`workbench benchmark`: numbers measured side by side in one run, so that ratios (not absolute
times on a noisy machine) carry the message.

- task generation rate (sentences/s) for LEGO n=12 and composite;
- training throughput of the lego-cpu model (tokens/s) and its achieved FLOP/s as a fraction of
  a float32 matmul peak measured in the same run (FLOPs counted by torch's FlopCounterMode);
- training steps/s of the lego-cpu shape (planted heads removed) at batch 128 and 512 in the four
  modes `train.compile` x `train.precision` offers, each timed after its own warm-up;
- the denormal slowdown at large init (composite, gamma 0.3) with and without flush-to-zero.

`--device cuda` (or `cpu`) instead measures the `lego-gpu` shape (8 layers, d 256, n = 12) on
that device (`run_device_benchmark`): steps/s and tokens/s in the four training modes, achieved
FLOP/s as a fraction of a bf16 matmul peak measured in the same run (fp32 where the device has
no bf16 kernels), the time to sample, pin and copy one training batch beside the time of one
step (the GPU waits for data unless sampling is shorter), and one exact head-by-position
patching sweep against TransformerLens's on the same model. Every CUDA timing synchronises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from analyses.bench_patching import best_times
from models.factory import build_model, forward
from models.presets import composite_cpu, lego_cpu, lego_gpu
from models.train import bf16_supported, compiled_forward, supervised_loss, to_device, training_precision
from tasks import CompositeConfig, LegoConfig, make_task, seeded_generator

CPU = torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU: without it a CUDA timing measures the launches only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], repeats: int, device: torch.device = CPU) -> float:
    """The fastest of `repeats` runs, in wall-clock seconds (the least disturbed by other
    processes), each ending when the device has finished its work."""
    synchronize(device)
    return best_times(lambda: (fn(), synchronize(device)), repeats)[0]


def generation_rate(task_cfg, n: int, repeats: int) -> float:
    task, gen = make_task(task_cfg), seeded_generator(0)
    return n / best_time(lambda: task.sample(n, gen), repeats)


def matmul_peak(size: int = 1024, repeats: int = 20, device: torch.device = CPU, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a square matmul of `dtype` on `device`, now."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    return 2 * size**3 / best_time(lambda: a @ b, repeats, device)


def training_step_fn(cfg, batch_size: int, compile: bool = False, precision: str = "fp32",
                     count_flops: bool = True, device: torch.device = CPU) -> tuple[Callable[[], None], int, int]:
    """A closure doing one full training step on `device` as the trainer does it (compiled or
    eager, fp32 or bf16 autocast; fused AdamW on CUDA), its FLOP count (0 unless `count_flops`)
    and tokens per step. The first call (compilation, for a compiled step) happens here."""
    task = make_task(cfg.task)
    model = build_model(cfg.model, task, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if device.type == "cuda" else None)
    batch = task.sample(batch_size, seeded_generator(0)).to(device)
    run_forward = compiled_forward() if compile else forward

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


def training_modes(batch_sizes: tuple[int, ...], repeats: int, cfg=None, device: torch.device = CPU,
                   shape: str = "lego-cpu shape, no planted heads") -> dict[str, float]:
    """Steps/s of a model (default: the lego-cpu shape without planted heads) on `device` in
    each training mode, side by side (each the best of `repeats` timings of a few steps); modes
    the device cannot run are skipped."""
    cfg = cfg or lego_cpu().with_overrides(["model.planted={}"])
    bf16 = bf16_supported(device)
    results: dict[str, float] = {}
    for batch_size in batch_sizes:
        rates = {}
        for name, (compiled, precision) in TRAINING_MODES.items():
            if precision == "bf16" and not bf16:
                continue
            step, _, _ = training_step_fn(cfg, batch_size, compiled, precision, count_flops=False, device=device)
            rates[name] = 3 / best_time(lambda step=step: [step() for _ in range(3)], repeats, device)
            results[f"steps_per_s_{name.replace(' ', '_')}_b{batch_size}"] = rates[name]
        eager = rates["eager fp32"]
        cells = ", ".join(f"{name} {rate:.2f} (x{rate / eager:.2f})" for name, rate in rates.items())
        print(f"training modes ({shape}, batch {batch_size}, {device.type}), steps/s: {cells}")
    if not bf16:
        print(f"  bf16 modes skipped: this {device.type} device has no bf16 matmul kernels "
              "(CPUs need AVX512-BF16 or AMX); train.precision=bf16 is refused here")
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


def data_and_step_times(cfg, batch_size: int, device: torch.device, repeats: int) -> tuple[float, float]:
    """Seconds to sample one training batch on the CPU and hand it to `device` as the trainer
    does (pinned, non-blocking on CUDA), and seconds of one eager fp32 training step there."""
    task, gen = make_task(cfg.task), seeded_generator(0)
    data = best_time(lambda: to_device(task.sample(batch_size, gen, split="train"), device), repeats, device)
    step, _, _ = training_step_fn(cfg, batch_size, count_flops=False, device=device)
    return data, best_time(step, repeats, device)


def patching_times(cfg, device: torch.device, n_pairs: int, repeats: int) -> dict[str, float]:
    """One exact head-by-position patching sweep, ours and TransformerLens's, on a fresh model of
    `cfg` on `device` (speed does not depend on training), with their largest difference."""
    from analyses.bench_patching import transformer_lens_by_pos, unaligned_pairs
    from interp.patching import logit_diff_metric, patch_head_out_by_pos

    task = make_task(cfg.task)
    model = build_model(cfg.model, task, device=device)
    clean, corrupted = (b.to(device) for b in unaligned_pairs(task, n_pairs, 0))
    args = (model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, 0))
    ours, theirs = patch_head_out_by_pos(*args).raw, transformer_lens_by_pos(*args)
    t_ours = best_time(lambda: patch_head_out_by_pos(*args), repeats, device)
    t_theirs = best_time(lambda: transformer_lens_by_pos(*args), repeats, device)
    return {"patching_exact_s": t_ours, "patching_transformer_lens_s": t_theirs,
            "patching_speedup_vs_transformer_lens": t_theirs / t_ours,
            "patching_max_abs_diff": (ours.to(theirs.device) - theirs).abs().max().item()}


def run_device_benchmark(device: torch.device, quick: bool = False) -> dict[str, float]:
    """The lego-gpu shape (d 256, 8 layers, n = 12) on `device`, every number side by side from
    this one run. On the CPU the batch is cut (a batch-512 step is over ten seconds there) and
    so is the patching model's depth, so that the CPU run takes a minute or two."""
    cfg = lego_gpu()
    cuda = device.type == "cuda"
    batch_size = cfg.train.batch_size if cuda else (8 if quick else 32)
    repeats = 3 if quick else 10
    bf16 = bf16_supported(device)
    peak_dtype = torch.bfloat16 if bf16 else torch.float32
    peak = matmul_peak(8192 if cuda else 1024, repeats, device, peak_dtype)
    results: dict[str, float] = {"batch_size": batch_size, "matmul_peak_flops": peak}
    print(f"device {device}{f' ({torch.cuda.get_device_name(device)})' if cuda else ''}: "
          f"{'bf16' if bf16 else 'fp32 (no bf16 kernels)'} matmul peak {peak / 1e12:.2f} TFLOP/s")

    modes = training_modes((batch_size,), repeats, cfg, device, shape="lego-gpu shape")
    results.update(modes)
    precision = "bf16" if bf16 else "fp32"
    step, flops, tokens = training_step_fn(cfg, batch_size, precision=precision, device=device)
    seconds = best_time(step, repeats, device)
    results.update(train_flops_per_step=flops, train_tokens_per_s=tokens / seconds, train_steps_per_s=1 / seconds,
                   fraction_of_peak=flops / seconds / peak)
    print(f"training (lego-gpu, batch {batch_size}, eager {precision}): {1 / seconds:.2f} steps/s, "
          f"{tokens / seconds:,.0f} tokens/s, {flops / 1e9:.1f} GFLOP/step = {flops / seconds / 1e12:.2f} TFLOP/s, "
          f"{flops / seconds / peak:.1%} of the {'bf16' if bf16 else 'fp32'} matmul peak (target on a GPU: >= 40%)")

    data, step_s = data_and_step_times(cfg, batch_size, device, repeats)
    results.update(data_s_per_batch=data, step_s=step_s)
    verdict = "sampling is shorter: the device need not wait" if data < step_s else "sampling is longer than a step: the device waits"
    print(f"data: {data * 1e3:.1f} ms to sample, pin and copy a batch of {batch_size}, beside {step_s * 1e3:.1f} ms "
          f"for an eager fp32 step ({verdict})")

    patch_cfg = cfg if cuda else cfg.with_overrides(["model.n_layers=2"])
    patched = patching_times(patch_cfg, device, n_pairs=8 if quick else 32, repeats=1 if quick else 3)
    results.update(patched)
    print(f"exact patching by (layer, pos, head), {patch_cfg.model.n_layers} layers: ours {patched['patching_exact_s']:.2f} s, "
          f"TransformerLens {patched['patching_transformer_lens_s']:.2f} s (x{patched['patching_speedup_vs_transformer_lens']:.1f}), "
          f"max difference {patched['patching_max_abs_diff']:.1e}")
    return results
