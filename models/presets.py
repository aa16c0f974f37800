"""Named run configurations: `*-cpu` presets learn on 2 CPU cores in minutes; `*-gpu` presets ask
for CUDA and bf16 and are sized by FLOP count to at most 10 minutes of one H100 each; `*-paper`
presets follow the papers' recipes (PAPERS.md) and want a GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from models.config import ModelConfig, RunConfig, TrainConfig
from tasks import CompositeConfig, ConfigError, LegoConfig, TemplatesConfig


def lego_cpu() -> RunConfig:
    """n=6 variables, #0-#2 supervised; the LEGO paper's hybrid model: one planted association
    head in each of layers 1-3, every other head learned, rotary positions. Without the planted
    heads #2 (the first association hop) stays at chance on CPU (analyses/RESULTS.md)."""
    association = {f"{layer}.0": "association" for layer in (1, 2, 3)}
    return RunConfig(
        task=LegoConfig(n_vars=6, supervision="first", n_supervised=3),
        model=ModelConfig(n_layers=4, d_model=64, n_heads=4, positional="rotary", planted=association),
        # 3,000 steps: with a 2,000-step cosine the lr decays before #2 is found (seed 0)
        train=TrainConfig(steps=3000, batch_size=128, lr=1e-3, warmup_steps=50, eval_every=250, checkpoint_every=500),
    )


def lego_paper() -> RunConfig:
    """BERT-base on n=12, #0-#5 supervised: 120,000 sentences, batch 1000, 200 epochs, lr 5e-5."""
    return RunConfig(
        task=LegoConfig(n_vars=12, supervision="first", n_supervised=6),
        model=ModelConfig(n_layers=12, d_model=768, n_heads=12, d_mlp=3072),
        train=TrainConfig(steps=24_000, batch_size=1000, lr=5e-5, min_lr=0.0, warmup_steps=0, weight_decay=0.0,
                          grad_clip=None, n_train=120_000, eval_every=600, eval_size=12_000, checkpoint_every=1200),
    )


def lego_gpu() -> RunConfig:
    """Between cpu and paper, for one GPU: n=12, #0-#5 supervised (the paper's task, so #6-#11
    measure extrapolation), a plain model (nothing planted) of 8 layers, d 256, learned positions,
    batch 512, bf16. Sized by FLOP count to a few minutes of one H100 (about 1.2 TFLOP per step);
    the wall time is measured only where a GPU was at hand (analyses/RESULTS.md)."""
    return RunConfig(
        task=LegoConfig(n_vars=12, supervision="first", n_supervised=6),
        model=ModelConfig(n_layers=8, d_model=256, n_heads=8, d_mlp=1024),
        train=TrainConfig(steps=20_000, batch_size=512, lr=5e-4, min_lr=1e-5, warmup_steps=1000, weight_decay=0.01,
                          eval_every=500, eval_size=4096, checkpoint_every=1000, precision="bf16", device="cuda"),
    )


def composite_cpu() -> RunConfig:
    """2 layers, one head, small init (gamma 0.8): learns the seen pairs in about a minute."""
    return RunConfig(
        task=CompositeConfig(),
        model=ModelConfig(n_layers=2, d_model=128, n_heads=1, d_head=64, d_mlp=384, init_gamma=0.8),
        train=TrainConfig(steps=1000, batch_size=256, lr=1e-3, warmup_steps=100, eval_every=100, checkpoint_every=500),
    )


def composite_matched() -> RunConfig:
    """The cpu protocol nearest the paper's that gave both of its depth-2 corners (issue 27,
    analyses/RESULTS.md): composite-cpu's width 128, pre-LN, with the paper's bias-free ReLU
    blocks, its public code's test keys (x mod 9), the paper's lower lr 1e-4, and a stop rule that
    waits for the held-out (4,3) answers to settle: at least 5,000 steps, then no gain in seen
    accuracy and neither held-out rate moving by more than .03 over 10 evaluations of 200 steps;
    at most 30,000 steps. Small init (gamma 0.9) by default, the inferential corner. The runs of
    the phase diagram at depth 2-4 took 5,000-11,200 steps, 11-49 minutes of one core (compiled
    fp32, beside other training)."""
    cpu = composite_cpu()
    return RunConfig(
        task=dataclasses.replace(cpu.task, key_modulus=9),
        model=dataclasses.replace(cpu.model, init_gamma=0.9, act_fn="relu", biases=False, norm_position="pre"),
        train=dataclasses.replace(cpu.train, steps=30_000, lr=1e-4, eval_every=200, checkpoint_every=1000,
                                  plateau_evals=10, plateau_min_steps=5000,
                                  plateau_watch=["held_out_inferential", "held_out_symmetric"], plateau_watch_tol=0.03),
    )


def composite_gpu() -> RunConfig:
    """The paper's model shape and block (d_model 400, one head of d_k 200, FFN 1200, post-LN) at
    batch 2048 on fresh data, bf16, until the seen pairs stop improving (the stop rule: 5
    evaluations of 200 steps; cpu runs stop at 900-1,600 steps of batch 256) or 6,000 steps.
    By FLOP count, an estimate: 0.29-0.72 TFLOP per step at depth 2-5, at most 4.3 PFLOP a
    model, under a minute at 100-200 TFLOP/s; so small a model is more likely bound by kernel
    launches, minutes per model. Wall times are measured only where a GPU was at hand."""
    return RunConfig(
        task=CompositeConfig(),
        model=ModelConfig(n_layers=2, d_model=400, n_heads=1, d_head=200, d_mlp=1200, init_gamma=0.5,
                          norm_position="post"),
        train=TrainConfig(steps=6000, batch_size=2048, lr=5e-4, min_lr=1e-5, warmup_steps=300, weight_decay=0.01,
                          grad_clip=1.0, eval_every=200, eval_size=10_000, checkpoint_every=1000, plateau_evals=5,
                          precision="bf16", device="cuda"),
    )


def composite_paper() -> RunConfig:
    """d_model 400, one head (d_k 200), FFN 1200; 900,000 samples, batch 2048, AdamW 2.5e-4 after
    a 10-epoch warm-up, cosine to 1e-5 over 200 epochs, weight decay 0.01, clip 1; post-LN blocks
    without attention or FFN biases and a ReLU FFN, as the paper's model (its group's public code).
    Not matched: that code splits test keys by x mod 9 (task.key_modulus=9), peaks at lr 2e-4 and
    decays every parameter; see analyses/RESULTS.md, the composite protocol differences."""
    steps_per_epoch = 900_000 // 2048
    return RunConfig(
        task=CompositeConfig(),
        model=ModelConfig(n_layers=2, d_model=400, n_heads=1, d_head=200, d_mlp=1200, init_gamma=0.5,
                          norm_position="post", act_fn="relu", biases=False),
        train=TrainConfig(steps=200 * steps_per_epoch, batch_size=2048, lr=2.5e-4, min_lr=1e-5,
                          warmup_steps=10 * steps_per_epoch, weight_decay=0.01, grad_clip=1.0, n_train=900_000,
                          eval_every=steps_per_epoch, eval_size=10_000, checkpoint_every=5 * steps_per_epoch),
    )


def templates_cpu() -> RunConfig:
    """Same-different on unseen symbols: 256 training symbols, 2 layers, identity-augmented
    attention, fixed random embeddings (as a templates-efficiency cpu cell); test = unseen symbols."""
    return RunConfig(
        task=TemplatesConfig(template="same_different", n_train_symbols=256, n_val_symbols=16, n_test_symbols=512),
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, identity_attention=True, fixed_embeddings=True),
        train=TrainConfig(steps=600, batch_size=256, lr=3e-3, warmup_steps=50, eval_every=150, eval_size=1000,
                          checkpoint_every=600),
    )


PRESETS: dict[str, Callable[[], RunConfig]] = {}  # name -> factory, in registration order
DEFAULT_PRESETS: dict[str, str] = {}  # task name -> the preset `workbench train --task NAME` uses


def register_preset(name: str, factory: Callable[[], RunConfig], default_for: str | None = None) -> None:
    """Make `name` a preset. `default_for`: the task whose default preset it is (a task's module in
    interp/tasks/ says so, registering its preset again with the same factory, or a new one)."""
    known = PRESETS.get(name)
    if known is not None and known is not factory:
        raise RuntimeError(f"two presets are named {name!r}: {known.__module__}.{known.__qualname__} and "
                           f"{factory.__module__}.{factory.__qualname__}")
    if default_for is not None and DEFAULT_PRESETS.get(default_for, name) != name:
        raise RuntimeError(f"task {default_for!r} has two default presets: {DEFAULT_PRESETS[default_for]!r} and {name!r}")
    PRESETS[name] = factory
    if default_for is not None:
        DEFAULT_PRESETS[default_for] = name


for _name, _factory in {
    "lego-cpu": lego_cpu, "lego-gpu": lego_gpu, "lego-paper": lego_paper, "composite-cpu": composite_cpu,
    "composite-matched": composite_matched, "composite-gpu": composite_gpu, "composite-paper": composite_paper,
    "templates-cpu": templates_cpu,
}.items():
    register_preset(_name, _factory)


def get_preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ConfigError(f"preset {name!r} is unknown; use one of {sorted(PRESETS)}")
    return PRESETS[name]()


def default_preset(task: str) -> str:
    """The preset a task trains with when none is named (registered by the task's interp module)."""
    if task not in DEFAULT_PRESETS:
        raise ConfigError(f"task {task!r} has no default preset; name one with --preset (see `workbench presets`)")
    return DEFAULT_PRESETS[task]
