"""Milliseconds per training step of a lone tiny composite run (the test suite's shape: 2 layers,
d 32, batch 16), one thread, through `Trainer.fit` of the checkout on PYTHONPATH, so that two
checkouts can be timed one after the other on the same machine:

    git worktree add /tmp/base 028255b
    for d in /tmp/base .; do PYTHONPATH=$d .venv/bin/python analyses/bench/lone_step_ms.py; done

Steps 50-300 are timed (the first 50 warm up); no evaluation or checkpoint falls inside them.
"""

import tempfile
import time

import torch

import models
from models.config import ModelConfig, RunConfig, TrainConfig
from models.train import Trainer
from tasks import CompositeConfig

torch.set_num_threads(1)
cfg = RunConfig(task=CompositeConfig(), model=ModelConfig(n_layers=2, d_model=32, n_heads=1, d_mlp=64, init_gamma=0.5),
                train=TrainConfig(steps=300, batch_size=16, warmup_steps=2, eval_every=1000, eval_size=64,
                                  checkpoint_every=1000, snapshots=0))
trainer = Trainer(cfg, tempfile.mkdtemp() + "/run", progress=False)
started: list[float] = []
next_batch = trainer._next_batch


def timed_next_batch():
    started.append(time.perf_counter())
    return next_batch()


trainer._next_batch = timed_next_batch
trainer.fit()
print(f"{models.__file__}: {(started[-1] - started[50]) / (len(started) - 51) * 1000:.2f} ms per step (steps 50-300)")
