"""One training loop for one run or many: runs of one shape train as one stacked ensemble.

`fit_members(trainers)` trains a list of `Trainer`s (models/train.py), each one run's state (its
config, task, data generators, schedule, stop rule, run folder, metrics, snapshots). One run is
an ensemble of one: its own model steps (`Trainer._train_step`, torch's AdamW), bit-identical
to the trainer before ensembles. Several runs of one shape (`shape_key`) step together: their
parameters stacked [K, ...], one forward and backward through `torch.func.vmap(functional_call)`,
and `StackedAdamW` (models/adamw_stacked.py) with each member's lr schedule, weight decay and
clipping. Each member draws its own batches from its own generators, evaluates, checkpoints and
snapshots into its own run folder (the stacked state is copied out into its model and optimizer
first, `Trainer.own_weights`); a member that stops (its steps, its stop rule, or divergence) is
finished and left out of the stack, whose remaining members go on. The folders are those of lone
runs, resumable alone or together.

Kept apart (`kept_apart`): the settings an ensemble cannot train as a lone run does; such a run
trains alone, in a group of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from models.adamw_stacked import StackedAdamW, clip_per_member, state_of
from models.config import RunConfig
from models.device import deterministic_kernels
from models.factory import unique_parameters

if TYPE_CHECKING:
    from models.train import Trainer
    from tasks import Batch

INIT_ONLY = ("init_gamma", "unembed_bias_init")  # model settings that change the initial weights, not the shape
SHARED_TRAIN = ("batch_size", "device")  # train settings one stacked step needs equal across members


def kept_apart(cfg: RunConfig) -> str | None:
    """Why a run of `cfg` cannot be a member of a larger ensemble (it trains alone), or None."""
    train, model = cfg.train, cfg.model
    if train.compile:
        return "train.compile: the compiled forward is one model's; the stacked forward is eager"
    if train.precision != "fp32":
        return f"train.precision={train.precision}: the stacked step is fp32 only (bf16 autocast is not checked)"
    if model.min_depth is not None:
        return "model.min_depth: stochastic depth draws each member's depth per step; one stacked forward has one"
    return None


def shape_key(cfg: RunConfig) -> tuple:
    """What runs must share to train as one ensemble: the model's shape and variant (every model
    setting but those of the initialisation), the task's (its config), batch size and device.
    Seeds, init scale, lr schedule, weight decay, clipping, steps and stop rule may differ."""
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


def fit_members(members: list[Trainer], progress: bool = True, desc: str | None = None) -> list[Any]:
    """Train every member to its end; per member its TrainResult, or for a member of a larger
    ensemble the TrainingDiverged that ended it (a lone run raises it, as it always has). Every
    member's folder is locked while training."""
    # denormal floats make CPU matmuls several times slower once small weights decay (large
    # init, gamma ~0.3); flushing them to zero changes no result we measure
    torch.set_flush_denormal(True)
    with contextlib.ExitStack() as stack:
        for member in members:
            stack.enter_context(member.folder.lock())
        stack.enter_context(deterministic_kernels(members[0].device))
        for member in members:
            member._restore() if member.resume else member._start()
        return _loop(members, progress, desc)


def _loop(members: list[Trainer], progress: bool, desc: str | None) -> list[Any]:
    from models.train import TrainingDiverged

    lone = len(members) == 1
    # in a log file (no terminal) one line every 30 s, not a redraw every second
    interval = 1.0 if sys.stderr.isatty() else 30.0
    for member in members:
        member.begin_loop()
    bar = tqdm(total=sum(m.cfg.train.steps for m in members), initial=sum(m.step for m in members),
               disable=not progress,
               desc=members[0].folder.path.name if lone else desc or f"ensemble of {len(members)}",
               dynamic_ncols=True, mininterval=interval)
    ended: dict[int, Any] = {}
    active = [m for m in members if not m.finished]
    stepper = _stepper(active) if active else None  # none when every member had finished (a resume)
    while active:
        try:
            failed = stepper.step([m._next_batch() for m in active])
        except TrainingDiverged as err:  # the last member of an ensemble, stepping alone
            if lone:
                raise
            failed = {id(active[0]): err}
        for member in active:
            if id(member) in failed:
                continue
            try:
                member.after_step()
            except TrainingDiverged as err:  # a GPU run's check, at evaluations and checkpoints
                if lone:
                    raise
                failed[id(member)] = err
        bar.update(len(active) - len(failed))
        first = active[0]
        if lone and (first.step % first.cfg.train.eval_every == 0 or first.step == first.cfg.train.steps):
            bar.set_postfix(loss=f"{first.record['train_loss']:.3f}",
                            acc=_headline(first.record, first.task.headline_metric))
        ended.update(failed)
        still = [m for m in active if not m.finished and id(m) not in failed]
        if len(still) < len(active):
            stepper = stepper.without(still)
            active = still
            if not lone:
                bar.set_postfix(training=len(active))
    bar.close()
    for member in members:
        member.pull = None
    return [ended.get(id(m)) or m.result() for m in members]


def _headline(record: dict[str, Any], metric: str) -> str:
    value = record.get(metric)
    return "-" if value is None else f"{value:.3f}"


def _stepper(members: list[Trainer]) -> Any:
    return LoneStepper(members[0]) if len(members) == 1 else StackedStepper(members)


class LoneStepper:
    """One member: its own model and torch AdamW (`Trainer._train_step`)."""

    def __init__(self, member: Trainer):
        self.member = member

    def step(self, batches: list[Batch]) -> dict[int, Any]:
        self.member._train_step(batches[0])  # raises TrainingDiverged itself
        return {}

    def without(self, members: list[Trainer]) -> LoneStepper | StackedStepper:
        return _stepper(members) if members else self


class StackedStepper:
    """Members of one shape as one stacked model: their parameters stacked [K, ...] (member 0's
    module runs them through `functional_call`, vmapped over the members), their optimizer
    states in a `StackedAdamW`. Each member's own model and optimizer are filled from the stack
    when it needs them (`pull`, set as its `Trainer.pull`)."""

    def __init__(self, members: list[Trainer]):
        self.members = list(members)
        self.base = members[0].model
        each = [unique_parameters(m.model) for m in members]
        self.own = each
        names = list(each[0])
        self.trainable = [n for n in names if each[0][n].requires_grad]
        self.params = {n: torch.stack([e[n].detach() for e in each]) for n in names}
        for name in self.trainable:
            self.params[name].requires_grad_(True)
        self.buffers = dict(self.base.named_buffers())
        lr_scale: dict[str, list[float]] = {}
        weight_decay: dict[str, list[float]] = {}
        state: dict[str, dict] = {}
        for name in self.trainable:
            groups = [_group_of(m.optimizer, e[name]) for m, e in zip(members, each)]
            lr_scale[name] = [g.get("lr_scale", 1.0) for g in groups]
            weight_decay[name] = [g["weight_decay"] for g in groups]
            saved = [state_of(m.optimizer, e[name]) for m, e in zip(members, each)]
            if any(s is not None for s in saved):
                like = self.params[name][0]
                state[name] = {"exp_avg": torch.stack([s[0] if s else torch.zeros_like(like) for s in saved]),
                               "exp_avg_sq": torch.stack([s[1] if s else torch.zeros_like(like) for s in saved]),
                               "steps": [s[2] if s else 0 for s in saved]}
        self.optimizer = StackedAdamW({n: self.params[n] for n in self.trainable}, lr_scale, weight_decay, state)
        self.version, self.pulled = 0, [0] * len(members)
        for index, member in enumerate(members):
            member.pull = self._puller(index)
        self._forward = vmap(self._one_forward, in_dims=(0, 0))

    def _one_forward(self, params: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, (params, self.buffers), (tokens,))

    def step(self, batches: list[Batch]) -> dict[int, Any]:
        """One training step of every member on its batch; the members whose loss was not finite
        (checked at once on the CPU, as a lone run does) by id, with the TrainingDiverged each
        recorded in its folder."""
        from models.train import TrainingDiverged, learning_rate, supervised_loss

        self.base.train()
        logits = self._forward(self.params, torch.stack([b.tokens for b in batches]))
        losses = torch.stack([supervised_loss(logits[k].float(), b) for k, b in enumerate(batches)])
        failed: dict[int, Any] = {}
        if losses.device.type == "cpu":  # on a GPU: `Trainer._check_finite`, at evaluations and checkpoints
            for member, value in zip(self.members, losses.tolist()):
                if not math.isfinite(value):
                    try:
                        member._record_divergence(value)
                    except TrainingDiverged as err:
                        failed[id(member)] = err
        grads = torch.autograd.grad(losses.sum(), [self.params[n] for n in self.trainable], allow_unused=True)
        clip_per_member([g for g in grads if g is not None], [m.cfg.train.grad_clip for m in self.members])
        lrs = [learning_rate(m.step, m.cfg.train) for m in self.members]
        self.optimizer.step(dict(zip(self.trainable, grads)), lrs)
        for member, loss in zip(self.members, losses.detach()):
            member.loss_sum += loss
            member.loss_count += 1
        self.version += 1
        return failed

    def _puller(self, index: int) -> Callable[[Trainer], None]:
        def pull(member: Trainer) -> None:
            if self.pulled[index] != self.version:
                self._copy_out(index, member)
                self.pulled[index] = self.version
        return pull

    @torch.no_grad()
    def _copy_out(self, index: int, member: Trainer) -> None:
        """The member's slice of the stacked parameters into its model, and of the optimizer's
        state into its torch AdamW (as torch keeps it: a float32 step count, on the CPU unless fused)."""
        own = self.own[index]
        for name, stacked in self.params.items():
            own[name].copy_(stacked[index])
        for name in self.trainable:
            entry = self.optimizer.state[name]
            steps = entry["steps"][index]
            if steps == 0:
                continue
            param = own[name]
            where = param.device if param.device.type == "cuda" else torch.device("cpu")
            member.optimizer.state[param] = {"step": torch.tensor(float(steps), dtype=torch.float32, device=where),
                                             "exp_avg": entry["exp_avg"][index].clone(),
                                             "exp_avg_sq": entry["exp_avg_sq"][index].clone()}

    def without(self, members: list[Trainer]) -> LoneStepper | StackedStepper:
        """The stepper of the members that go on: every member's state copied out first, so the
        new stack starts where this one ended."""
        for member in self.members:
            member.own_weights()
            member.pull = None
        if not members:
            return self
        return _stepper(members)


def _group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, Any]:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    raise ValueError("a trainable parameter is in none of the optimizer's groups")

