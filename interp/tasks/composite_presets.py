"""The composite task's presets, registered on import (`models.presets.register_preset`):
`composite-cpu` is the task's default preset and the quick start's (`workbench demo`, a bare
`workbench train`)."""

from __future__ import annotations

import dataclasses

from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import register_preset
from tasks import CompositeConfig


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


def composite_code() -> RunConfig:
    """The composite group's own run, setting for setting, as their public code wrote it
    (xuzhiqin1990/understanding_dl, code/book_jupyter_composition_task, result_0.8): post-LN,
    2 layers, d 400, one head (d_k 200), ReLU FFN 1200, no attention or FFN biases, the output bias
    at torch's default, 201 tokens, 20 positions; gamma 0.8, seed 1; AdamW over every parameter
    (decay 0.01, eps 1e-8), clip 1; lr 1e-5 rising linearly to 2e-4 over 10 epochs, cosine to 1e-5
    over 200 more; 210 epochs of the 370 whole batches of 2048 in their 759,375 training
    sequences, shuffled each epoch; evaluated every 3 epochs. Where ours differs (its training
    sequences are drawn anew, not theirs; the warm-up read as warmup-scheduler 0.3's) see
    analyses/lab/scoreboard.md, the composite protocol differences."""
    per_epoch, n_train = 370, 759_375
    paper = composite_paper()
    return RunConfig(
        task=dataclasses.replace(paper.task, key_modulus=9, vocab_size=201),
        model=dataclasses.replace(paper.model, init_gamma=0.8, n_ctx=20, unembed_bias_init="uniform"),
        train=dataclasses.replace(paper.train, steps=210 * per_epoch, lr=2e-4, min_lr=1e-5, warmup_from=1e-5,
                                  warmup_steps=10 * per_epoch, weight_decay_on="all", n_train=n_train,
                                  sampling="epochs", seed=1, eval_every=3 * per_epoch,
                                  checkpoint_every=3 * per_epoch),
    )


register_preset("composite-cpu", composite_cpu, default_for="composite", quick_start=True)
register_preset("composite-matched", composite_matched)
register_preset("composite-gpu", composite_gpu)
register_preset("composite-paper", composite_paper)
register_preset("composite-code", composite_code)
