"""Which runs can train together as one stacked ensemble (models/train.py, `train_runs`).

Runs of one shape (`shape_key`) step together: their parameters stacked [K, ...], one forward and
backward vmapped over the members (models/step.py), each member with its own seed, init scale, lr
schedule, weight decay, clipping, steps and stop rule, each writing its own run folder (a lone
run's, resumable alone or together). A run that cannot be a member (`kept_apart`) trains alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from models.config import RunConfig

INIT_ONLY = ("init_gamma", "unembed_bias_init")  # model settings that change the initial weights, not the shape
# train settings one stacked step needs equal across members: the batch's shape, the device,
# and what the compiled graph is specialised on
SHARED_TRAIN = ("batch_size", "device", "compile", "precision", "tf32", "adam_beta2", "adam_eps", "loss_dtype",
                "softmax")


def kept_apart(cfg: RunConfig) -> str | None:
    """Why a run of `cfg` cannot be a member of a larger ensemble (it trains alone), or None."""
    if cfg.model.min_depth is not None:
        return "model.min_depth: stochastic depth draws each run's depth per step; one stacked forward has one depth"
    return None


def shape_key(cfg: RunConfig) -> tuple:
    """What runs must share to train as one ensemble: the model's shape and variant (every model
    setting but those of the initialisation), the task's (its config), batch size, device,
    compile and precision. Seeds, init scale, lr schedule, weight decay, clipping, steps and stop
    rule may differ."""
    model = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in INIT_ONLY}
    train = {k: getattr(cfg.train, k) for k in SHARED_TRAIN}
    return repr((sorted(model.items()), sorted(dataclasses.asdict(cfg.task).items()), sorted(train.items()),
                 type(cfg.task).__name__))


def group_by_shape(cells: dict[str, RunConfig]) -> list[list[str]]:
    """The cells' names in groups that can train as one ensemble each, in `cells` order: same
    `shape_key`, none `kept_apart` (such a cell is a group of one)."""
    groups: dict[Any, list[str]] = {}
    for name, cfg in cells.items():
        key = ("alone", name) if kept_apart(cfg) else shape_key(cfg)
        groups.setdefault(key, []).append(name)
    return list(groups.values())
