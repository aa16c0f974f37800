"""Training: the loop, and one run's bookkeeping.

`train_runs(runs)` is the one training loop, for K >= 1 runs of one shape trained together (K = 1
is a lone run): each step it draws every run's batch, calls the step (models/step.py: forward,
loss, backward, clipping and AdamW over the stacked parameters, compiled whole with
train.compile), then lets each run do what is due at its new step: snapshot, evaluation with the
stop rule, checkpoint. A `Trainer` is one run's state: config, task, data generators, schedule,
stop rule, run folder, metrics and snapshots; its weights live in its own model, which the loop
fills from the stack when the run needs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from models.config import RunConfig, TrainConfig
from models.device import bf16_supported, check_precision, deterministic_kernels, resolve_device
from models.factory import build_model, forward, unique_parameters
from models.memory import EVAL_CHUNK, check_memory
from models.run_folder import RunFolder
from models.runs import (
    LoadedRun,
    Moment,
    Progress,
    RunFolderError,
    load_run,
    load_weights,
    read_config,
    run_state,
    same_recipe,
    verified_weights,
)
from models.snapshots import MAX_EVENT_SNAPSHOTS, EventWatch, SnapshotKeeper, scheduled_steps
from models.step import Member, Moments, Stack
from tasks import Batch, ConfigError, Task, logits_at_labels, make_task, seeded_generator

IDENTITY_SCALARS = ("identity_a", "identity_b")  # models/identity_attention.py
# seed offsets of a run's data, from train.seed: training batches use the seed itself
EVAL_SEED_OFFSET = 1_000_003  # the evaluation batch (test split)
TRAIN_SET_SEED_OFFSET = 2_000_003  # the fixed training set of train.n_train
EPOCH_SEED_OFFSET = 5_000_011  # epoch e's order of that set (train.sampling="epochs") is seeded seed + this + e


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run is recorded as diverged."""


@dataclass
class TrainResult:
    steps: int
    seconds: float
    final: dict[str, Any]


def has_cpu_compiler() -> bool:
    """Whether a C++ compiler is on PATH (torch.compile's CPU backend builds C++ kernels)."""
    return bool(shutil.which("g++") or shutil.which("c++"))


def check_compile(device: torch.device, compile: bool) -> None:
    """torch.compile's CPU backend builds C++ kernels: refuse up front rather than at step 1."""
    if compile and device.type == "cpu" and not has_cpu_compiler():
        raise ConfigError("train.compile=true on the CPU needs a C++ compiler (g++) on PATH; install one, "
                          "or train with train.compile=false")


def fastest_cpu_options() -> dict[str, Any]:
    """The training speed options this CPU can run: `compile` where a C++ compiler is on PATH,
    bf16 `precision` where it has bf16 kernels. Configs built from them depend on the machine."""
    device = torch.device("cpu")
    return {"compile": has_cpu_compiler(),
            "precision": "bf16" if bf16_supported(device) else "fp32"}


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The lr of the step after `step` steps: a linear warm-up to `lr` over `warmup_steps` (from
    `warmup_from`, or from lr/warmup_steps), then cosine decay to `min_lr` at `steps`."""
    if step < cfg.warmup_steps:
        if cfg.warmup_from is not None:
            return cfg.warmup_from + (cfg.lr - cfg.warmup_from) * step / cfg.warmup_steps
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def starting_weights(cfg: RunConfig, model: torch.nn.Module,
                     source: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`train.init_from`: the weights of the run in `source` and what init.json records about
    them. RunFolderError (exit 2) when the folder holds no readable weights, a model section
    other than `cfg`'s, or weights of other shapes than `model`'s (another task vocabulary)."""
    source_cfg = read_config(source)
    theirs, ours = dataclasses.asdict(source_cfg.model), dataclasses.asdict(cfg.model)
    if theirs != ours:
        differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise RunFolderError(f"train.init_from={source}: its model differs from this run's in {differ} "
                             f"({', '.join(f'{k}: {theirs.get(k)!r} vs {ours.get(k)!r}' for k in differ)})")
    if run_state(source, source_cfg, repair=False) != "done":
        raise RunFolderError(f"train.init_from={source}: that run has not finished; train it first")
    tensors, stamp = verified_weights(source)
    shapes = {name: tuple(p.shape) for name, p in unique_parameters(model).items()}
    wrong = {name: (tuple(tensors[name].shape), shape) for name, shape in shapes.items()
             if name in tensors and tuple(tensors[name].shape) != shape}
    if wrong or set(shapes) - set(tensors):
        raise RunFolderError(f"train.init_from={source}: its weights do not fit this run's task (another vocabulary "
                             f"or sequence length?): {wrong or sorted(set(shapes) - set(tensors))}")
    record = {"from": str(source), "step": stamp.step, "weights_digest": stamp.digest}
    return tensors, record


def evaluation_batch(task: Task, train: TrainConfig) -> Batch:
    """The run's fixed held-out batch (`eval_size` strings of the test split), from its own seed,
    so it is the same however training is split, and for any model trained with this config."""
    return task.sample(train.eval_size, seeded_generator(train.seed + EVAL_SEED_OFFSET), split="test")


def training_set(task: Task, train: TrainConfig) -> Batch | None:
    """The fixed training set of `train.n_train` samples, or None for fresh data every step."""
    n = train.n_train
    return task.sample(n, seeded_generator(train.seed + TRAIN_SET_SEED_OFFSET)) if n else None


def next_training_batch(task: Task, train_set: Batch | None, size: int, gen: torch.Generator) -> Batch:
    """The next training batch, drawn with `gen` (seeded with train.seed at step 0): fresh
    training-split samples, or rows of the fixed training set drawn with replacement. One
    function for every trainer of a config, so they see the same batches in the same order."""
    if train_set is None:
        return task.sample(size, gen, split="train")
    return train_set.select(torch.randint(len(train_set), (size,), generator=gen))


class Epochs:
    """`train.sampling="epochs"`: the batch of step t is the (t mod E)-th slice of epoch t // E's
    shuffled order of the fixed training set, E = n_train // batch_size (the last partial batch
    dropped). An epoch's order comes from the seed and the epoch alone, so it needs no state."""

    def __init__(self, train_set: Batch, batch_size: int, seed: int):
        self.train_set, self.batch_size, self.seed = train_set, batch_size, seed
        self.per_epoch = len(train_set) // batch_size
        self._order: tuple[int, torch.Tensor] | None = None

    def batch(self, step: int) -> Batch:
        epoch, index = divmod(step, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            gen = seeded_generator(self.seed + EPOCH_SEED_OFFSET + epoch)
            self._order = epoch, torch.randperm(len(self.train_set), generator=gen)
        return self.train_set.select(self._order[1][index * self.batch_size:(index + 1) * self.batch_size])


def train(cfg: RunConfig, folder: RunFolder | str | Path, *, resume: bool = False,
          progress: bool = True) -> TrainResult:
    """Train one run into `folder` (resume it with `resume=True`): `Trainer(...).fit()`."""
    return Trainer(cfg, folder, resume=resume, progress=progress).fit()


def train_runs(runs: list[Trainer], progress: bool = True, desc: str | None = None) -> list[Any]:
    """Train every run to its end, together: per run its TrainResult, or for a member of a larger
    ensemble the TrainingDiverged that ended it (a lone run raises it). Every run's folder is
    locked while training. The runs must share one shape (models/ensemble.py, `shape_key`)."""
    # denormal floats make CPU matmuls several times slower once small weights decay (large
    # init, gamma ~0.3); flushing them to zero changes no result we measure
    torch.set_flush_denormal(True)
    first = runs[0]
    with contextlib.ExitStack() as held:
        held.enter_context(deterministic_kernels(first.device, tf32=first.cfg.train.tf32))
        for run in runs:
            held.enter_context(run.folder.lock())
        for run in runs:
            run._restore() if run.resume else run._start()
        for run in runs:
            run.begin_loop()
        with _progress_bar(runs, progress, desc) as bar:
            ended = _loop(runs, bar)
    return [ended.get(id(run)) or run.result() for run in runs]


def _loop(runs: list[Trainer], bar: tqdm) -> dict[int, TrainingDiverged]:
    """The loop: steps until every run has finished. Runs that finish are frozen in the stack;
    once half of it is frozen, the runs still training are stacked anew."""
    lone, ended = len(runs) == 1, {}
    active = [run for run in runs if not run.finished]
    while active:
        train = active[0].cfg.train  # what the stacked step shares (models/ensemble.py, SHARED_TRAIN)
        stack = Stack([run.member() for run in active], compile=train.compile, precision=train.precision,
                      device=active[0].device, adam=(train.adam_beta2, train.adam_eps),
                      loss=(train.loss_dtype, train.softmax))
        while 2 * sum(stack.live) > stack.size:
            stepping = sum(stack.live)
            batches = [run._next_batch() if live else None for run, live in zip(active, stack.live)]
            losses = stack.step(batches, [run.learning_rate() for run in active], active[0].draw_depth())
            on_cpu = losses.device.type == "cpu"  # the CPU checks every step's loss; a GPU, at evaluations
            for k, (run, loss) in enumerate(zip(active, losses.tolist() if on_cpu else [None] * stack.size)):
                if not stack.live[k]:
                    continue
                try:
                    run.count_step(loss)
                    if run.wants_weights():
                        run.loss_sum += stack.copy_out(k)
                    run.after_step()
                except TrainingDiverged as err:
                    if lone:
                        raise
                    ended[id(run)] = err
                if run.finished or id(run) in ended:
                    stack.freeze(k)
            bar.update(stepping)
            _show(bar, active, lone)
        for k, run in enumerate(active):
            if stack.live[k]:
                run.loss_sum += stack.copy_out(k)
        active = [run for run, live in zip(active, stack.live) if live]
    return ended


def _progress_bar(runs: list[Trainer], progress: bool, desc: str | None) -> tqdm:
    # in a log file (no terminal) one line every 30 s, not a redraw every second
    interval = 1.0 if sys.stderr.isatty() else 30.0
    name = runs[0].folder.path.name if len(runs) == 1 else desc or f"ensemble of {len(runs)}"
    return tqdm(total=sum(r.cfg.train.steps for r in runs), initial=sum(r.step for r in runs), disable=not progress,
                desc=name, dynamic_ncols=True, mininterval=interval)


def _show(bar: tqdm, runs: list[Trainer], lone: bool) -> None:
    if not lone:
        bar.set_postfix(training=sum(not run.finished for run in runs))
        return
    run = runs[0]
    if run.step % run.cfg.train.eval_every == 0 or run.step == run.cfg.train.steps:
        value = run.record.get(run.task.headline_metric)
        bar.set_postfix(loss=f"{run.record['train_loss']:.3f}", acc="-" if value is None else f"{value:.3f}")


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, batch: Batch) -> tuple[float, torch.Tensor]:
    """The loss a run records as eval_loss, on `batch` (on the model's device): cross-entropy at
    the label positions the loss scores, at full depth; and the logits at every label position."""
    logits = torch.cat([forward(model, batch.tokens[i : i + EVAL_CHUNK]) for i in range(0, len(batch), EVAL_CHUNK)])
    picked = logits_at_labels(logits, batch.label_pos)
    scored = batch.label_mask & batch.loss_mask if batch.loss_mask.any() else batch.label_mask
    return F.cross_entropy(picked[scored], batch.labels[scored]).item(), picked


class Trainer:
    """One run: trains into `folder` (a RunFolder, or its path), which says what the run's files
    are and checks what it reads. With `resume=True` it continues from the folder's last
    checkpoint and ends with the same weights as an uninterrupted run. `fit()` trains it alone;
    `train_runs` trains several together."""

    def __init__(self, cfg: RunConfig, folder: RunFolder | str | Path, *, resume: bool = False, progress: bool = True):
        self.cfg, self.resume, self.progress = cfg, resume, progress
        self.folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
        self.task = make_task(cfg.task)
        self.device = resolve_device(cfg.train.device)
        check_precision(self.device, cfg.train.precision)
        check_compile(self.device, cfg.train.compile)
        check_memory(cfg, self.task, self.device)  # before anything is allocated or written
        self.model = build_model(cfg.model, self.task, seed=cfg.train.seed, device=self.device)
        # by name, each shared one once; training updates them in place, so these stay the model's
        self.params = unique_parameters(self.model)
        self.groups = self._param_groups()
        self.moments: dict[str, Moments] = {}  # AdamW's state by parameter name, filled by the stack
        seed = cfg.train.seed
        self.data_gen, self.depth_gen = seeded_generator(seed), seeded_generator(seed + 1)
        # evaluation data comes from its own seeds, so it is the same however training is split
        self.eval_batch = evaluation_batch(self.task, cfg.train)
        self._check_stop_rule_metrics()
        self.train_set = training_set(self.task, cfg.train)
        self.epochs = (Epochs(self.train_set, cfg.train.batch_size, cfg.train.seed)
                       if cfg.train.sampling == "epochs" else None)
        # the training loss summed since the last evaluation: the stack sums it on the device and
        # hands it over when the run's weights are copied out
        self.step, self.loss_count, self.elapsed, self.loss_sum = 0, 0, 0.0, 0.0
        # checked before anything is written; a resumed run starts from its own checkpoint instead
        self.init = (None if resume or cfg.train.init_from is None
                     else starting_weights(cfg, self.model, Path(cfg.train.init_from)))
        self.snapshots: SnapshotKeeper | None = None  # opened when the run starts or resumes
        # the whole training state of the last evaluation, kept in states/ if the next one is an event
        self.held_moment: Moment | None = None

    def fit(self) -> TrainResult:
        """Train this run alone (an ensemble of one)."""
        return train_runs([self], progress=self.progress)[0]

    def _snapshot_keeper(self) -> SnapshotKeeper | None:
        """What keeps the run's snapshots (models/snapshots.py); None with train.snapshots=0."""
        train = self.cfg.train
        if train.snapshots == 0:
            return None
        watch = [self.task.headline_metric] if train.snapshot_watch is None else list(train.snapshot_watch)
        return SnapshotKeeper(self.folder.path, scheduled_steps(train.snapshots, train.steps),
                              EventWatch(train.snapshot_loss_factor, watch, train.snapshot_watch_delta))

    def _check_stop_rule_metrics(self) -> None:
        """The stop rule's metrics (the task's headline, `plateau_watch`) must be among what the
        task's evaluation records: checked before anything is written, on the evaluation batch
        scored with placeholder predictions (only the names matter)."""
        if self.cfg.train.plateau_evals is None:
            return
        batch = self.eval_batch
        recorded = {"train_loss", "eval_loss", *self.task.accuracy(batch, torch.zeros_like(batch.labels))}
        wanted = [self.task.headline_metric, *self.cfg.train.plateau_watch]
        missing = [name for name in wanted if name not in recorded]
        if missing:
            raise ConfigError(f"train.plateau_evals / train.plateau_watch: the stop rule reads {missing}, "
                              f"which this task's "
                              f"evaluation does not record; it records {sorted(recorded)}")

    def _param_groups(self) -> dict[str, tuple[float, float]]:
        """Every parameter's (lr scale, weight decay), in the order of torch AdamW's param groups
        (decayed, not decayed, identity scalars), which numbers the optimizer state in the train
        state. Weight decay on weight matrices only (`weight_decay_on="all"`: on every
        parameter); the identity-attention scalars at `identity_lr_scale` times the lr when it is
        not 1 (they decay only under "all")."""
        train, params = self.cfg.train, self.params
        leaf = {n: n.rsplit(".", 1)[-1] for n in params}
        scaled = {n for n in params if leaf[n] in IDENTITY_SCALARS} if train.identity_lr_scale != 1 else set()
        decays = (lambda n: True) if train.weight_decay_on == "all" else (lambda n: leaf[n].startswith("W_"))
        groups = {n: (1.0, train.weight_decay) for n in params if decays(n) and n not in scaled}
        groups.update({n: (1.0, 0.0) for n in params if not decays(n) and n not in scaled})
        scaled_decay = train.weight_decay if train.weight_decay_on == "all" else 0.0
        groups.update({n: (train.identity_lr_scale, scaled_decay) for n in params if n in scaled})
        return groups

    def member(self) -> Member:
        """What the step needs of this run (models/step.py)."""
        return Member(self.model, self.moments, self.groups, self.cfg.train.grad_clip)

    def begin_loop(self) -> None:
        """Ready for the training loop, after `_start` or `_restore`: the clock, and whether the
        stop rule ended this run already (a resumed run it stopped)."""
        self.record: dict[str, Any] = {}
        self.started = time.perf_counter() - self.elapsed
        self.stopped = self.resume and bool((self.folder.metrics() or [{}])[-1].get("stopped"))  # a new run's are empty

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.train.steps or self.stopped

    def learning_rate(self) -> float:
        """This step's learning rate (the schedule's; parameters scale it by their lr scale)."""
        return learning_rate(self.step, self.cfg.train)

    def draw_depth(self) -> int | None:
        """Stochastic depth: how many blocks this step runs, drawn from the run's own generator."""
        low = self.cfg.model.min_depth
        if low is None:
            return None
        return int(torch.randint(low, self.cfg.model.n_layers + 1, (1,), generator=self.depth_gen))

    def count_step(self, loss: float | None) -> None:
        """A step taken: `loss` is its training loss where it was read (the CPU reads every
        step's, and a non-finite one ends the run as diverged; a GPU's is checked at evaluations
        and checkpoints)."""
        if loss is not None and not math.isfinite(loss):
            self._record_divergence(loss)
        self.step += 1
        self.loss_count += 1

    def wants_weights(self) -> bool:
        """Whether `after_step` reads this run's weights: a snapshot, evaluation or checkpoint is due."""
        train, step = self.cfg.train, self.step
        return ((self.snapshots is not None and self.snapshots.due(step)) or step % train.eval_every == 0
                or step % train.checkpoint_every == 0 or step == train.steps or step in train.keep_state)

    def after_step(self) -> None:
        """What follows a training step, with the run's weights in its model: the scheduled
        snapshot, the evaluation (and the stop rule) and the checkpoint where they are due."""
        train = self.cfg.train
        if self.snapshots is not None and self.snapshots.due(self.step):
            self.snapshots.after_step(self.step, self.params)
        self.elapsed = time.perf_counter() - self.started
        if self.step % train.eval_every == 0 or self.step == train.steps:
            self.record = self._evaluate()
            self.stopped = bool(self.record.get("stopped"))
        if self.step % train.checkpoint_every == 0 or self.step == train.steps or self.stopped:
            self._checkpoint()
        if self.step in train.keep_state:
            self.folder.keep_moment(self._moment())

    def result(self) -> TrainResult:
        return TrainResult(self.step, self.elapsed, self.record or (self.folder.metrics() or [{}])[-1])

    def _start(self) -> None:
        """A new run, if the folder may receive it (`RunFolder.check_receives`), asked under its
        lock: a run another process finished meanwhile is never overwritten."""
        self.folder.check_receives(self.cfg)
        self.folder.start(self.cfg)
        self._begin_at_step_0()

    def _begin_at_step_0(self) -> None:
        """Empty metrics, then the starting weights: another run's (`init_from`), or mimicking
        pre-training if the config asks for it."""
        if self.cfg.train.init_from is not None and self.init is None:  # a resume of a run that crashed before
            self.init = starting_weights(self.cfg, self.model, Path(self.cfg.train.init_from))  # its first checkpoint
        self.folder.clear_metrics()
        if self.init is not None:
            tensors, record = self.init
            load_weights(self.model, {name: t.to(self.device) for name, t in tensors.items()})
            self.folder.write_init(record)
        if self.cfg.train.mimic_steps:
            self._mimic()
        self.snapshots = self._snapshot_keeper()
        if self.snapshots is not None:  # step 0: the weights training starts from
            self.snapshots.start(self.params)

    def _mimic(self) -> None:
        """Mimicking pre-training (models/mimic.py) from its own seed; its losses go to mimic.json.
        A run killed during it has no checkpoint yet, so resuming it starts again from scratch."""
        from models.mimic import mimic_attention

        gen = seeded_generator(self.cfg.train.seed + 3_000_003)
        losses = mimic_attention(self.model, self.task, self.cfg.train.mimic_steps, gen, progress=self.progress)
        self.folder.write_mimic({"steps": len(losses), "final_loss": losses[-1],
                                 "loss": losses[:: max(1, len(losses) // 100)]})

    def _next_batch(self) -> Batch:
        """The next training batch, on the CPU (the stack moves the members' batches to the device
        together)."""
        if self.epochs is not None:
            return self.epochs.batch(self.step)
        return next_training_batch(self.task, self.train_set, self.cfg.train.batch_size, self.data_gen)

    def _check_finite(self) -> None:
        """The divergence check of a GPU run, where the loss is not read every step: at each
        evaluation and before each checkpoint, so no NaN weights are ever saved; the recorded
        step is then the first evaluation or checkpoint after the loss became NaN."""
        if not math.isfinite(self.loss_sum):
            self._record_divergence(self.loss_sum)

    def _record_divergence(self, value: float) -> None:
        self.folder.append_metrics({"step": self.step, "diverged": True, "train_loss": str(value)})
        raise TrainingDiverged(
            f"the training loss became {value} at step {self.step}; the run is recorded as diverged in "
            f"{self.folder.metrics_file}. Lower train.lr (now {self.cfg.train.lr}), set train.grad_clip, "
            f"or raise model.init_gamma (smaller initial weights)."
        )

    @torch.no_grad()
    def _evaluate(self) -> dict[str, Any]:
        """Loss and task accuracies on the fixed held-out batch, at full depth."""
        self._check_finite()
        self.model.eval()
        batch = self.eval_batch.to(self.device)
        eval_loss, picked = held_out_loss(self.model, batch)
        record = {
            "step": self.step, "lr": learning_rate(self.step - 1, self.cfg.train),
            "train_loss": self.loss_sum / max(1, self.loss_count), "eval_loss": eval_loss,
            "elapsed_s": round(self.elapsed, 2), **self.task.accuracy(batch.to("cpu"), picked.argmax(-1).cpu()),
        }
        self.loss_sum, self.loss_count = 0.0, 0
        if self.snapshots is not None:
            events = self.snapshots.at_evaluation(self.step, record, self.params)
            if events:
                record["snapshot_events"] = events
                if self.held_moment is not None and len(self.folder.kept_moments()) < MAX_EVENT_SNAPSHOTS:
                    self.folder.keep_moment(self.held_moment)  # the state before the event, to replay it
            self.held_moment = self._moment()
        if self._plateaued(record):
            record["stopped"] = "plateau"
        self.folder.append_metrics(record)
        return record

    def _plateaued(self, record: dict[str, Any]) -> bool:
        """The stop rule (`train.plateau_evals`): the headline accuracy of the last N evaluations,
        this one included, rises no more than `plateau_tol` above its best before them; not
        before `plateau_min_steps`, and only once every `plateau_watch` metric has moved by no
        more than `plateau_watch_tol` over those N evaluations."""
        train = self.cfg.train
        n = train.plateau_evals
        if n is None:
            return False
        # also checked at the start (_check_stop_rule_metrics); a name the evaluation batch of a
        # particular step lacks is caught here
        missing = [name for name in train.plateau_watch if name not in record]
        if missing:
            raise ConfigError(f"train.plateau_watch names {missing}, which this task's evaluation does not record; "
                              f"it records {sorted(k for k, v in record.items() if isinstance(v, (int, float)))}")
        metric = self.task.headline_metric
        if metric not in record:
            raise ConfigError(f"train.plateau_evals: the stop rule reads the task's headline metric {metric!r}, which "
                              f"its evaluation does not record (it records {sorted(record)})")
        if self.step >= train.steps or self.step < train.plateau_min_steps:
            return False
        records = [r for r in self.folder.metrics() if "train_loss" in r] + [record]
        history = [r.get(metric) for r in records]
        if len(history) <= n or any(v is None for v in history):
            return False
        if max(history[-n:]) > max(history[:-n]) + train.plateau_tol:
            return False
        return all(_settled([r.get(name) for r in records[-n:]], train.plateau_watch_tol)
                   for name in train.plateau_watch)

    @property
    def generators(self) -> dict[str, torch.Generator]:
        """The random generators a checkpoint saves, by name: training data and stochastic depth."""
        return {"data": self.data_gen, "depth": self.depth_gen}

    def _checkpoint(self) -> None:
        """The run folder's checkpoint (`RunFolder.save_checkpoint`), after the divergence check,
        so that no NaN weights are ever saved."""
        self._check_finite()
        self.folder.save_checkpoint(self._moment())

    def _moment(self) -> Moment:
        """The whole training state now, copied. The optimizer state is as torch's AdamW keeps it:
        by the parameter's index in its param groups, with a float32 step count."""
        state = {index: {"step": torch.tensor(float(m.steps), dtype=torch.float32), "exp_avg": m.exp_avg,
                         "exp_avg_sq": m.exp_avg_sq}
                 for index, name in enumerate(self.groups) if (m := self.moments.get(name)) is not None}
        weights = {name: p.detach().clone() for name, p in self.params.items()}
        return Moment(Progress(self.step, self.elapsed, self.loss_sum, self.loss_count), weights, state,
                      {name: gen.get_state() for name, gen in self.generators.items()})

    def _restore(self) -> None:
        """Continue from the folder's checkpoint. Its train state is the truth: a weights file that
        is missing, damaged or of another step is rewritten from it. A folder with a config but no
        train state (a crash before the first checkpoint) starts again from step 0."""
        checkpoint = self.folder.resume_point(self.cfg.train.steps, self.cfg.train.eval_every)
        if checkpoint is None:
            self._begin_at_step_0()
            return
        load_weights(self.model, checkpoint.weights, source=checkpoint.path)
        names = list(self.groups)
        state = checkpoint.optimizer_state([self.params[n] for n in names], self.device)
        self.moments.update({names[index]: Moments(entry["exp_avg"], entry["exp_avg_sq"], int(entry["step"].item()))
                             for index, entry in state.items()})
        checkpoint.restore_generators(self.generators)
        checkpoint.check_digest()  # after the checks by field, which name what is wrong
        progress = checkpoint.progress
        self.step, self.elapsed, self.loss_count = progress.step, progress.elapsed, progress.loss_count
        self.loss_sum = float(progress.loss_sum)
        self.folder.restore_weights_file(checkpoint)
        self.folder.drop_metrics_after(self.step)
        self.snapshots = self._snapshot_keeper()
        if self.snapshots is not None:
            self.snapshots.resume(self.step, self.folder.metrics(), checkpoint.weights)


def _settled(values: list[Any], tol: float) -> bool:
    """Whether a watched metric's last values moved by no more than `tol`; a metric that some of
    them lack (not measured at those evaluations) has not settled."""
    if any(not isinstance(v, (int, float)) for v in values):
        return False
    return max(values) - min(values) <= tol


def train_or_load(cfg: RunConfig, run_dir: str | Path, progress: bool = True) -> LoadedRun:
    """The trained run in `run_dir`: loaded when it is finished, resumed when it was cut short,
    trained when the folder is new. For notebooks and scripts that should not retrain what
    exists. A folder that holds a run of another config is an error, not silently reused."""
    folder = RunFolder(run_dir)
    if folder.holds_run() and not same_recipe(read_config(folder.path), cfg):
        raise ConfigError(f"{run_dir} holds a run with another config; choose another folder or load it with load_run")
    if run_state(folder.path, cfg) != "done":
        train(cfg, folder, resume=folder.has_checkpoint(), progress=progress)
    return load_run(folder.path)
