"""LEGO's presets and curricula, registered on import (`models.presets.register_preset`,
`models.curriculum.register_curriculum`): `lego-cpu` is the task's default preset and the
workbench's quick start (`workbench demo`, and `workbench train` with nothing named).

`lego-three-hops` (analyses/RESULTS.md) is why curricula exist: on 2 CPU cores no plain LEGO model
follows three association hops from random init, but one that first learns one hop on an easier
task (six letters, #0-#2) keeps going: #0-#4 of n = 6, then #0-#4 of n = 8 with eight letters.
`workbench curriculum lego-three-hops --out DIR` trains it; each stage resumes like any run."""

from __future__ import annotations

import dataclasses

from models.config import ModelConfig, RunConfig, TrainConfig
from models.curriculum import Curriculum, Stage, register_curriculum
from models.presets import register_preset
from tasks import LegoConfig


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


LEGO_THREE_HOPS = Curriculum(
    name="lego-three-hops",
    preset="lego-cpu",
    common=("model.planted={}", "train.batch_size=512", "train.eval_every=250", "train.checkpoint_every=250",
            "train.eval_size=1000", "train.compile=true", "train.precision=bf16"),
    stages=(
        # the one-hop model (zoo lego-association's recipe): six letters, #0-#2 of n = 6
        Stage("1-one-hop", ("task.n_letters=6", "train.steps=2500")),
        # the same task, #0-#4 supervised: three hops for #4
        Stage("2-three-hops-n6", ("task.n_letters=6", "task.n_supervised=5", "train.steps=2000",
                                  "train.warmup_steps=100")),
        # the target: n = 8, eight letters, #0-#4 supervised, #5-#7 never
        Stage("3-three-hops-n8", ("task.n_vars=8", "task.n_letters=8", "task.n_supervised=5", "train.steps=1000",
                                  "train.warmup_steps=100")),
    ),
    about="a plain LEGO model (nothing planted or mimicked) taught three association hops in three stages: "
          "one hop with six letters (#0-#2 of 6), then #0-#4 of 6, then #0-#4 of n = 8 with eight letters",
    shown=("acc_per_var", "acc per variable"),
)


# ALBERT (every layer one shared block): the same stages, a longer first one. Seed 0 of the tied
# model stayed on the plateau through a 2,500-step first stage, where both BERT seeds left it
# (analyses/RESULTS.md).
LEGO_THREE_HOPS_ALBERT = Curriculum(
    name="lego-three-hops-albert",
    preset=LEGO_THREE_HOPS.preset,
    common=(*LEGO_THREE_HOPS.common, "model.tie_layers=true"),
    stages=(Stage("1-one-hop", ("task.n_letters=6", "train.steps=6000")), *LEGO_THREE_HOPS.stages[1:]),
    about="lego-three-hops for ALBERT (tied layers), with a 6,000-step first stage",
)

# The paper's task shape: after the three stages, n = 12 with twelve letters and #0-#5 supervised
# (the paper supervises the first half of its 12 variables). Meant for 12 layers on a GPU
# (analyses/gpu/lego12.sh); the stages before it are the ones above, unchanged.
LEGO_N12_STAGE = Stage("4-n12", ("task.n_vars=12", "task.n_letters=12", "task.n_supervised=6", "train.steps=2000",
                                 "train.warmup_steps=100"))
LEGO_N12 = dataclasses.replace(LEGO_THREE_HOPS, name="lego-n12", stages=(*LEGO_THREE_HOPS.stages, LEGO_N12_STAGE),
                               about="lego-three-hops, then the paper's task: #0-#5 of n = 12 with twelve letters")
LEGO_N12_ALBERT = dataclasses.replace(
    LEGO_THREE_HOPS_ALBERT, name="lego-n12-albert", stages=(*LEGO_THREE_HOPS_ALBERT.stages, LEGO_N12_STAGE),
    about="lego-three-hops-albert (tied layers), then #0-#5 of n = 12 with twelve letters")


register_preset("lego-cpu", lego_cpu, default_for="lego")
register_preset("lego-gpu", lego_gpu)
register_preset("lego-paper", lego_paper)
for _curriculum in (LEGO_THREE_HOPS, LEGO_THREE_HOPS_ALBERT, LEGO_N12, LEGO_N12_ALBERT):
    register_curriculum(_curriculum)
