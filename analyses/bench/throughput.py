"""`workbench benchmark`: numbers measured side by side in one run, so that ratios (not absolute
times on a noisy machine) carry the message.

- task generation rate (sentences/s) for LEGO n=12 and composite;
- training throughput of the lego-cpu model (tokens/s) and its achieved FLOP/s as a fraction of
  a float32 matmul peak measured in the same run (FLOPs counted by torch's FlopCounterMode);
- training steps/s of the lego-cpu shape (planted heads removed) at batch 128 and 512 in the four
  modes `train.compile` x `train.precision` offers, each timed after its own warm-up;
- the denormal slowdown at large init (composite, gamma 0.3) with and without flush-to-zero.

`--device cuda` (or `cpu`) instead measures the `lego-gpu` shape (8 layers, d 256, n = 12; batch
512 on CUDA, 8 or 32 on the CPU) on that device (`run_device_benchmark`):

- steps/s and tokens/s in the four training modes, side by side;
- achieved FLOP/s of each mode (one step's FLOPs counted by FlopCounterMode; the modes do the
  same arithmetic) as a fraction of a bf16 matmul peak measured in the same run (8192 x 8192 on
  CUDA; fp32 where the device has no bf16 kernels). The issue's target: >= 40% in the best mode;
- whether the device waits for data: the time to sample one training batch on the CPU, pin it
  and copy it, beside a step of the preset's mode with a fixed batch and with a fresh batch
  sampled before each step as the trainer does (the host samples the next batch while the GPU
  runs the step before, so on CUDA the two match unless sampling is the bottleneck);
- one exact head-by-position patching sweep against TransformerLens's on a fresh model of the
  shape (timing does not depend on training); on the CPU with 2 layers instead of 8, since
  TransformerLens's loop, one forward pass per cell, grows with the square of the depth.

Every timing on CUDA synchronises before it starts and before it ends (`best_time`, `timed`), or
it would measure the kernel launches only.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import interp.tasks  # noqa: F401 (registers each task's presets)
from analyses.bench.patching import best_times
from models.device import bf16_supported, to_device
from models.factory import build_model, forward
from models.presets import get_preset
from models.step import Stack, masked_cross_entropy
from models.train import Trainer, check_compile
from tasks import Batch, CompositeConfig, ConfigError, LegoConfig, make_task, seeded_generator

CPU = torch.device("cpu")

UNWRITTEN = Path(tempfile.gettempdir()) / "workbench-benchmark"  # the benchmark's runs write nothing
DEVICE_PRESET = "lego-gpu"  # the shape `workbench benchmark --device` times


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU: without it a CUDA timing measures the launches only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], repeats: int, device: torch.device = CPU) -> float:
    """The fastest of `repeats` runs, in wall-clock seconds (the least disturbed by other
    processes), each ending when the device has finished its work."""
    synchronize(device)
    return best_times(lambda: (fn(), synchronize(device)), repeats)[0]


def timed(fn: Callable[[], object], device: torch.device = CPU) -> tuple[object, float]:
    """`fn()` and the wall-clock seconds it took, until the device finished: one run, for work
    too long to repeat."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def generation_rate(task_cfg, n: int, repeats: int) -> float:
    task, gen = make_task(task_cfg), seeded_generator(0)
    return n / best_time(lambda: task.sample(n, gen), repeats)


def matmul_peak(size: int = 1024, repeats: int = 20, device: torch.device = CPU,
                dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a square matmul of `dtype` on `device`, now."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    return 2 * size**3 / best_time(lambda: a @ b, repeats, device)


def training_stack(cfg, device: torch.device, root, k: int = 1, compile: bool = False,
                   precision: str = "fp32") -> tuple[list[Trainer], Stack]:
    """K runs of `cfg` (seeds 0..K-1; folders under `root`, where nothing is written)
    and their stack (models/step.py): the trainer's own step, compiled or eager, fp32 or bf16."""
    overrides = [f"train.device={device.type}", f"train.compile={str(compile).lower()}",
                 f"train.precision={precision}", "train.eval_size=64", "train.snapshots=0", "train.mimic_steps=0",
                 "train.plateau_evals=null", "train.plateau_min_steps=0", "train.plateau_watch=[]"]
    gammas = [0.5, 0.7, 0.9, 1.0]
    runs = [Trainer(cfg.with_overrides([*overrides, f"train.seed={index}", f"model.init_gamma={gammas[index % 4]}"]),
                    Path(root) / f"m{index}", progress=False) for index in range(k)]
    return runs, Stack([run.member() for run in runs], compile=compile, precision=precision, device=device)


def training_step_fn(cfg, batch_size: int, compile: bool = False, precision: str = "fp32",
                     count_flops: bool = True, device: torch.device = CPU) -> tuple[Callable[..., None], int, int]:
    """A closure doing one training step of one run on `device` as the trainer does it (its
    stack of one: compiled or eager, fp32 or bf16 autocast, clipping, AdamW), on a batch sampled
    here or the one it is given; its FLOP count (0 unless `count_flops`) and tokens per step.
    The first calls (compilation, for a compiled step) happen here."""
    cfg = cfg.with_overrides([f"train.batch_size={batch_size}"])
    runs, stack = training_stack(cfg, device, UNWRITTEN, 1, compile, precision)
    sampled = runs[0]._next_batch()

    def step(batch: Batch = sampled) -> None:
        stack.step([batch], [1e-4])

    step(), step()
    if not count_flops:
        return step, 0, sampled.tokens.numel()
    return step, step_flops(cfg, device), sampled.tokens.numel()


def step_flops(cfg, device: torch.device) -> int:
    """The FLOPs of one eager training step of one run of `cfg` (FlopCounterMode)."""
    runs, stack = training_stack(cfg, device, UNWRITTEN)
    batch = runs[0]._next_batch()
    with FlopCounterMode(display=False) as counter:
        stack.step([batch], [1e-4])
    return counter.get_total_flops()


TRAINING_MODES = {"eager fp32": (False, "fp32"), "eager bf16": (False, "bf16"),
                  "compiled fp32": (True, "fp32"), "compiled bf16": (True, "bf16")}


def mode_key(name: str, batch_size: int) -> str:
    return f"{name.replace(' ', '_')}_b{batch_size}"


def compiles_here(device: torch.device) -> bool:
    """Whether torch.compile can run on `device` here; if not, says why the compiled timings are skipped."""
    try:
        check_compile(device, True)
    except ConfigError as err:
        print(f"  compiled steps skipped: {err}")
        return False
    return True


def runnable_modes(device: torch.device) -> dict[str, tuple[bool, str]]:
    """The training modes `device` can run here, after saying why each other one is skipped."""
    bf16 = bf16_supported(device)
    if not bf16:
        print(f"  bf16 modes skipped: this {device.type} device has no bf16 matmul kernels "
              "(CPUs need AVX512-BF16 or AMX); train.precision=bf16 is refused here")
    compiles = compiles_here(device)
    return {name: (compiled, precision) for name, (compiled, precision) in TRAINING_MODES.items()
            if (bf16 or precision != "bf16") and (compiles or not compiled)}


def training_modes(batch_sizes: tuple[int, ...], repeats: int, cfg=None, device: torch.device = CPU,
                   shape: str = "lego-cpu shape, no planted heads", compiled: bool = True) -> dict[str, float]:
    """Steps/s and tokens/s of a model (default: the lego-cpu shape without planted heads) on
    `device` in each training mode, side by side (each the best of `repeats` timings of a few
    steps); modes the device cannot run are skipped, saying why, and compiled ones unless `compiled`."""
    cfg = cfg or get_preset("lego-cpu").with_overrides(["model.planted={}"])
    modes = {name: mode for name, mode in runnable_modes(device).items() if compiled or not mode[0]}
    results: dict[str, float] = {}
    for batch_size in batch_sizes:
        rates = {}
        for name, (compiled, precision) in modes.items():
            step, _, tokens = training_step_fn(cfg, batch_size, compiled, precision, count_flops=False, device=device)
            rates[name] = 3 / best_time(lambda step=step: [step() for _ in range(3)], repeats, device)
            results[f"steps_per_s_{mode_key(name, batch_size)}"] = rates[name]
            results[f"tokens_per_s_{mode_key(name, batch_size)}"] = rates[name] * tokens
        eager = rates["eager fp32"]
        cells = ", ".join(f"{name} {rate:.2f} (x{rate / eager:.2f}, {rate * tokens:,.0f} tokens/s)"
                          for name, rate in rates.items())
        print(f"training modes ({shape}, batch {batch_size}, {device.type}), steps/s: {cells}")
    return results


def denormal_step_rate(flush: bool, warm_steps: int, timed_steps: int) -> float:
    """Training steps/s of the composite-cpu model at gamma 0.3, measured after `warm_steps`
    (the slowdown appears once weights and moments have shrunk)."""
    cfg = get_preset("composite-cpu").with_overrides(["model.init_gamma=0.3"])
    task = make_task(cfg.task)
    model = build_model(cfg.model, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    gen = seeded_generator(0)
    torch.set_flush_denormal(flush)
    for i in range(warm_steps + timed_steps):
        if i == warm_steps:
            start = time.perf_counter()
        batch = task.sample(cfg.train.batch_size, gen)
        weights = batch.loss_mask.float()
        loss = masked_cross_entropy(forward(model, batch.tokens), batch.label_pos, batch.labels, weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return timed_steps / (time.perf_counter() - start)


QUICK_BATCH = 16  # --quick tests the command's shape: its training steps at this batch, not lego-cpu's 128


def run_benchmarks(quick: bool = False) -> dict[str, float]:
    repeats = 2 if quick else 5
    n = 10_000 if quick else 100_000
    results = {
        "lego12_sentences_per_s": generation_rate(LegoConfig(n_vars=12, n_supervised=6), n, repeats),
        "composite_sequences_per_s": generation_rate(CompositeConfig(), n, repeats),
    }
    print(f"task generation  LEGO n=12: {results['lego12_sentences_per_s']:,.0f} sentences/s (target >= 100,000)")
    print(f"task generation  composite: {results['composite_sequences_per_s']:,.0f} sequences/s")

    cfg = get_preset("lego-cpu")
    batch_size = QUICK_BATCH if quick else cfg.train.batch_size
    step, flops, tokens = training_step_fn(cfg, batch_size)
    peak = matmul_peak(repeats=5 if quick else 20)
    seconds = best_time(step, 3 if quick else 10)
    results.update(train_tokens_per_s=tokens / seconds, train_flops_per_s=flops / seconds, matmul_peak_flops=peak)
    print(f"training (lego-cpu, batch {batch_size}): {tokens / seconds:,.0f} tokens/s, "
          f"{1 / seconds:.1f} steps/s, {flops / 1e6:.1f} MFLOP/step")
    print(f"achieved {flops / seconds / 1e9:.2f} GFLOP/s = {flops / seconds / peak:.1%} of the float32 matmul "
          f"peak measured now ({peak / 1e9:.1f} GFLOP/s, 1024x1024)")

    if quick:
        print("compiled training modes skipped: --quick (compilation alone takes minutes on a CPU)")
    batches = (QUICK_BATCH,) if quick else (128, 512)
    results.update(training_modes(batches, repeats=repeats, compiled=not quick))
    if not quick:  # the composite phase study's cells (cpu scale: compiled, bf16 where the CPU has it)
        composite = {f"composite_d{depth}_" + key: value for depth in (2, 5) for key, value in training_modes(
            (256,), 5, get_preset("composite-cpu").with_overrides([f"model.n_layers={depth}"]),
            shape=f"composite-cpu shape, depth {depth}").items()}
        results.update(composite)

    warm, timed = (10, 5) if quick else (400, 100)
    slow, fast = denormal_step_rate(False, warm, timed), denormal_step_rate(True, warm, timed)
    results.update(denormal_off_steps_per_s=slow, denormal_flush_steps_per_s=fast)
    print(f"large init (composite-cpu, gamma 0.3, after {warm} steps): {slow:.1f} steps/s without flush-to-zero, "
          f"{fast:.1f} with it (x{fast / slow:.2f}); the trainer always flushes")
    return results


def data_and_step_times(cfg, batch_size: int, device: torch.device, repeats: int,
                        precision: str = "fp32") -> dict[str, float]:
    """Whether `device` waits for data: seconds to sample one training batch on the CPU and hand
    it to `device` as the trainer does (pinned, non-blocking on CUDA), and seconds per training
    step in `precision` (compiled as `cfg` says) with one fixed batch and with a fresh batch
    sampled and handed over before each step, as the trainer's loop does. The host samples the
    next batch while the GPU runs the step before, so on CUDA the two steps take as long unless
    sampling, with the step's launches, is the slower."""
    task, gen = make_task(cfg.task), seeded_generator(0)

    def fresh_batch() -> Batch:
        return to_device(task.sample(batch_size, gen, split="train"), device)

    data = best_time(fresh_batch, repeats, device)
    step, _, _ = training_step_fn(cfg, batch_size, cfg.train.compile, precision, count_flops=False, device=device)
    fixed = best_time(lambda: [step() for _ in range(3)], repeats, device) / 3
    fed = best_time(lambda: [step(fresh_batch()) for _ in range(3)], repeats, device) / 3
    return {"data_s_per_batch": data, "step_s": fixed, "step_with_data_s": fed}


def patching_times(cfg, device: torch.device, n_pairs: int, repeats: int) -> dict[str, float]:
    """One exact head-by-position patching sweep, ours and TransformerLens's, on a fresh model of
    `cfg` on `device` (speed does not depend on training), with their largest difference."""
    from analyses.bench.patching import transformer_lens_by_pos, unaligned_pairs
    from interp.patching import logit_diff_metric, patch_head_out_by_pos

    task = make_task(cfg.task)
    model = build_model(cfg.model, task, device=device)
    clean, corrupted = (b.to(device) for b in unaligned_pairs(task, n_pairs, 0))
    args = (model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, 0))
    ours = patch_head_out_by_pos(*args).raw
    t_ours = best_time(lambda: patch_head_out_by_pos(*args), repeats, device)
    # TransformerLens's sweep is a loop of thousands of forward passes, the longest part of the
    # CPU benchmark: its first run, timed, is also the reference to compare with
    theirs, t_theirs = timed(lambda: transformer_lens_by_pos(*args), device)
    if repeats > 1:
        t_theirs = min(t_theirs, best_time(lambda: transformer_lens_by_pos(*args), repeats - 1, device))
    return {"patching_exact_s": t_ours, "patching_transformer_lens_s": t_theirs,
            "patching_speedup_vs_transformer_lens": t_theirs / t_ours,
            "patching_max_abs_diff": (ours.to(theirs.device) - theirs).abs().max().item()}


def peak_matmul(device: torch.device) -> tuple[torch.dtype, int]:
    """The square matmul whose FLOP/s stand for `device`'s peak: bf16 (fp32 where the device
    has no bf16 kernels); on CUDA 8192 x 8192, large enough to keep every SM busy."""
    return torch.bfloat16 if bf16_supported(device) else torch.float32, 8192 if device.type == "cuda" else 1024


def fractions_of_peak(cfg, batch_size: int, device: torch.device, rates: dict[str, float], peak: float,
                      peak_dtype: str) -> dict[str, float]:
    """Achieved FLOP/s of each training mode timed in `rates` (`training_modes`'s results) as a
    fraction of `peak`, and the best mode's steps/s and tokens/s. One eager fp32 step's FLOPs are
    counted (FlopCounterMode): autocast and compilation change how the modes compute, not what."""
    _, flops, tokens = training_step_fn(cfg, batch_size, device=device)
    keys = {name: f"steps_per_s_{mode_key(name, batch_size)}" for name in TRAINING_MODES}
    steps_per_s = {name: rates[key] for name, key in keys.items() if key in rates}
    best = max(steps_per_s, key=steps_per_s.get)
    results = {f"fraction_of_peak_{mode_key(name, batch_size)}": rate * flops / peak
               for name, rate in steps_per_s.items()}
    results.update(train_flops_per_step=flops, train_steps_per_s=steps_per_s[best],
                   train_tokens_per_s=steps_per_s[best] * tokens, fraction_of_peak=steps_per_s[best] * flops / peak)
    cells = ", ".join(f"{name} {rate * flops / peak:.1%}" for name, rate in steps_per_s.items())
    print(f"achieved FLOP/s ({flops / 1e9:.1f} GFLOP/step) as a fraction of the {peak_dtype} matmul peak: {cells}; "
          f"best, {best}: {steps_per_s[best] * flops / 1e12:.3g} TFLOP/s = {results['fraction_of_peak']:.1%} "
          "(target on a GPU: >= 40%)")
    return results


def print_data_wait(results: dict[str, float], batch_size: int, mode: str, device: torch.device) -> None:
    data, fixed, fed = results["data_s_per_batch"], results["step_s"], results["step_with_data_s"]
    if device.type != "cuda":
        verdict = f"on the CPU sampling runs between the steps and adds {data / fixed:.1%} to each"
    elif fed <= 1.05 * fixed:
        verdict = "the GPU does not wait for data"
    else:
        verdict = "the GPU waits for data: sampling and launching a step take longer than the step"
    print(f"data: {data * 1e3:.1f} ms to sample, pin and copy a batch of {batch_size}; a step ({mode}) takes "
          f"{fixed * 1e3:.1f} ms on a fixed batch, {fed * 1e3:.1f} ms sampling each batch as the trainer does "
          f"({fed / fixed - 1:+.1%}): {verdict}")


def run_device_benchmark(device: torch.device, quick: bool = False) -> dict[str, float]:
    """The lego-gpu shape (d 256, 8 layers, n = 12) on `device`, every number side by side from
    this one run. On the CPU the batch is cut (a batch-512 step is over ten seconds there) and
    so is the patching model's depth, so that the CPU run takes a few minutes."""
    cfg = get_preset(DEVICE_PRESET)
    cuda = device.type == "cuda"
    batch_size = cfg.train.batch_size if cuda else (8 if quick else 32)
    repeats, n_pairs = (3, 8) if quick else (10, 32)
    print(f"device {device}{f' ({torch.cuda.get_device_name(device)})' if cuda else ''}, lego-gpu shape, "
          f"batch {batch_size}")
    dtype, size = peak_matmul(device)
    before = matmul_peak(size, 20, device, dtype)  # 20 short runs: the best comes near the peak on a shared machine too
    results: dict[str, float] = {"batch_size": batch_size}
    results.update(training_modes((batch_size,), repeats, cfg, device, shape="lego-gpu shape"))
    # the better of before and after the training timings: a shared machine's load changes
    results["matmul_peak_flops"] = peak = max(before, matmul_peak(size, 20, device, dtype))
    peak_dtype = "bf16" if dtype == torch.bfloat16 else "fp32 (no bf16 kernels)"
    print(f"{peak_dtype} matmul peak measured in this run: {peak / 1e12:.3g} TFLOP/s ({size}x{size}, the better "
          "of before and after the training timings)")
    results.update(fractions_of_peak(cfg, batch_size, device, results, peak, peak_dtype))

    precision = cfg.train.precision if bf16_supported(device) else "fp32"
    results.update(data_and_step_times(cfg, batch_size, device, repeats, precision))
    print_data_wait(results, batch_size, f"{'compiled' if cfg.train.compile else 'eager'} {precision}", device)

    patch_cfg = cfg if cuda else cfg.with_overrides(["model.n_layers=2"])
    patched = patching_times(patch_cfg, device, n_pairs, repeats=1 if quick else 3)
    results.update(patched)
    print(f"exact patching by (layer, pos, head), {patch_cfg.model.n_layers} layers, {n_pairs} pairs: "
          f"ours {patched['patching_exact_s']:.2f} s, TransformerLens {patched['patching_transformer_lens_s']:.2f} s "
          f"(x{patched['patching_speedup_vs_transformer_lens']:.1f}), "
          f"max difference {patched['patching_max_abs_diff']:.1e}")
    return results
