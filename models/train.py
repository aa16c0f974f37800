"""The trainer: AdamW with warm-up + cosine, loss only on supervised labels, periodic evaluation
on held-out data, atomic resumable checkpoints, and a stop with a clear message on divergence.

A `Trainer` is one run's state: config, task, data generators, schedule, stop rule, run folder,
metrics and snapshots. `Trainer.fit()` trains it as an ensemble of one (models/ensemble.py, the one
training loop): `_train_step` steps its own model, `after_step` evaluates and checkpoints. Several
Trainers of one shape train as one stacked ensemble, each still writing its own run folder.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from models.config import RunConfig, TrainConfig
from models.device import (  # re-exported: models.train is where callers import them from
    bf16_supported,
    check_precision,
    cuda_deterministic,  # noqa: F401
    deterministic_kernels,  # noqa: F401
    resolve_device,
    to_device,
    training_precision,
)
from models.factory import build_model, forward, unique_parameters
from models.memory import EVAL_CHUNK, check_memory
from models.runs import (
    LoadedRun,
    Progress,
    RunFolder,
    RunFolderError,
    load_run,
    load_weights,
    read_config,
    run_state,
    same_recipe,
    verified_weights,
)
from models.snapshots import EventWatch, SnapshotKeeper, scheduled_steps
from tasks import Batch, ConfigError, Task, logits_at_labels, make_task, seeded_generator

IDENTITY_SCALARS = ("identity_a", "identity_b")  # models/identity_attention.py
# seed offsets of a run's data, from train.seed: training batches use the seed itself
EVAL_SEED_OFFSET = 1_000_003  # the evaluation batch (test split)
TRAIN_SET_SEED_OFFSET = 2_000_003  # the fixed training set of train.n_train


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


def compiled_forward():
    """`models.factory.forward` through torch.compile. The function is compiled, not the module,
    so that what the model's own forward does around the blocks (planted heads remember the
    tokens there) is traced too; it is unwrapped first, since dynamo cannot trace the runtime
    type checkers the tests install around it. Dynamo's caches are cleared first: a graph
    compiled for one model can otherwise be reused for another of the same shapes whose own
    forward differs (measured: a planted model ran a plain model's graph), so one process
    trains one compiled model at a time."""
    torch._dynamo.reset()
    return torch.compile(inspect.unwrap(forward))


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to `lr` over `warmup_steps`, then cosine decay to `min_lr` at `steps`."""
    if step < cfg.warmup_steps:
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


def supervised_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Cross-entropy over the supervised labels only, read at their label positions."""
    picked = logits_at_labels(logits, batch.label_pos)
    return F.cross_entropy(picked[batch.loss_mask], batch.labels[batch.loss_mask])


class Trainer:
    """Trains one run into `folder` (a RunFolder, or its path), which says what the run's files
    are and checks what it reads. With `resume=True` it continues from the folder's last
    checkpoint and ends with the same weights as an uninterrupted run."""

    def __init__(self, cfg: RunConfig, folder: RunFolder | str | Path, *, resume: bool = False, progress: bool = True):
        self.cfg, self.resume, self.progress = cfg, resume, progress
        self.folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
        self.task = make_task(cfg.task)
        self.device = resolve_device(cfg.train.device)
        check_memory(cfg, self.task, self.device)  # before anything is allocated or written
        self.model = build_model(cfg.model, self.task, seed=cfg.train.seed, device=self.device)
        self.optimizer = self._make_optimizer()
        check_precision(self.device, cfg.train.precision)
        check_compile(self.device, cfg.train.compile)
        # evaluation, patching and analysis use the eager model; only training steps are compiled
        self.train_forward = compiled_forward() if cfg.train.compile else forward
        seed = cfg.train.seed
        self.data_gen, self.depth_gen = seeded_generator(seed), seeded_generator(seed + 1)
        # evaluation data comes from its own seeds, so it is the same however training is split
        self.eval_batch = evaluation_batch(self.task, cfg.train)
        self._check_stop_rule_metrics()
        self.train_set = training_set(self.task, cfg.train)
        # the training loss is summed on the device and read at evaluations and checkpoints only,
        # so a GPU never waits for the host within a step
        self.step, self.loss_count, self.elapsed = 0, 0, 0.0
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        # checked before anything is written; a resumed run starts from its own checkpoint instead
        self.init = (None if resume or cfg.train.init_from is None
                     else starting_weights(cfg, self.model, Path(cfg.train.init_from)))
        self.snapshots = self._snapshot_keeper()
        self.pull = None  # set by a stacked ensemble (models/ensemble.py): copies this member's state out

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

    def _make_optimizer(self) -> torch.optim.AdamW:
        """Weight decay on weight matrices only (`weight_decay_on="all"`: on every parameter); the
        identity-attention scalars in a group of their own when `identity_lr_scale` != 1 (each
        group's lr is the schedule's times its `lr_scale`; they decay only under "all")."""
        train, params = self.cfg.train, unique_parameters(self.model)
        leaf = {n: n.rsplit(".", 1)[-1] for n in params}
        scaled = {n for n in params if leaf[n] in IDENTITY_SCALARS} if train.identity_lr_scale != 1 else set()
        decays = (lambda n: True) if train.weight_decay_on == "all" else (lambda n: leaf[n].startswith("W_"))
        decay = [p for n, p in params.items() if decays(n) and n not in scaled]
        rest = [p for n, p in params.items() if not decays(n) and n not in scaled]
        groups = [{"params": decay, "weight_decay": train.weight_decay, "lr_scale": 1.0},
                  {"params": rest, "weight_decay": 0.0, "lr_scale": 1.0}]
        if scaled:
            groups.append({"params": [params[n] for n in scaled], "lr_scale": train.identity_lr_scale,
                           "weight_decay": train.weight_decay if train.weight_decay_on == "all" else 0.0})
        # the fused kernel on CUDA: one launch for all parameters (the CPU keeps the default, so
        # CPU weights stay bit-identical to those of earlier versions)
        return torch.optim.AdamW(groups, lr=train.lr, fused=True if self.device.type == "cuda" else None)

    def fit(self) -> TrainResult:
        """Train the run: an ensemble of one (models/ensemble.py, `fit_members`), which trains
        this model itself, step by step, as it always has."""
        from models.ensemble import fit_members

        return fit_members([self], progress=self.progress)[0]

    def begin_loop(self) -> None:
        """Ready for the training loop, after `_start` or `_restore`: the clock, and whether the
        stop rule ended this run already (a resumed run it stopped)."""
        self.record: dict[str, Any] = {}
        self.started = time.perf_counter() - self.elapsed
        self.stopped = bool((self.folder.metrics() or [{}])[-1].get("stopped"))

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.train.steps or self.stopped

    def after_step(self) -> None:
        """What follows a training step: the scheduled snapshot, the evaluation (and the stop
        rule) and the checkpoint where they are due. In an ensemble `own_weights` first copies
        this member's weights and optimizer state out of the stacked ones."""
        train = self.cfg.train
        self.step += 1
        if self.snapshots is not None and self.snapshots.due(self.step):
            self.own_weights()
            self.snapshots.after_step(self.step, unique_parameters(self.model))
        self.elapsed = time.perf_counter() - self.started
        if self.step % train.eval_every == 0 or self.step == train.steps:
            self.own_weights()
            self.record = self._evaluate()
            self.stopped = bool(self.record.get("stopped"))
        if self.step % train.checkpoint_every == 0 or self.step == train.steps or self.stopped:
            self.own_weights()
            self._checkpoint()

    def own_weights(self) -> None:
        """Make `self.model` and `self.optimizer` hold this run's current weights and state: they
        do, unless a stacked ensemble trains it (which sets `self.pull`)."""
        if self.pull is not None:
            self.pull(self)

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
        if self.snapshots is not None:  # step 0: the weights training starts from
            self.snapshots.start(unique_parameters(self.model))

    def _mimic(self) -> None:
        """Mimicking pre-training (models/mimic.py) from its own seed; its losses go to mimic.json.
        A run killed during it has no checkpoint yet, so resuming it starts again from scratch."""
        from models.mimic import mimic_attention

        gen = seeded_generator(self.cfg.train.seed + 3_000_003)
        losses = mimic_attention(self.model, self.task, self.cfg.train.mimic_steps, gen, progress=self.progress)
        self.folder.write_mimic({"steps": len(losses), "final_loss": losses[-1],
                                 "loss": losses[:: max(1, len(losses) // 100)]})

    def _next_batch(self) -> Batch:
        return to_device(next_training_batch(self.task, self.train_set, self.cfg.train.batch_size, self.data_gen),
                         self.device)

    def _train_step(self, batch: Batch) -> None:
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.cfg.train) * group.get("lr_scale", 1.0)
        with training_precision(self.device, self.cfg.train.precision):
            logits = self.train_forward(self.model, batch.tokens, self._draw_depth())
        loss = supervised_loss(logits.float(), batch)
        if self.device.type == "cpu" and not torch.isfinite(loss):  # on a GPU: `_check_finite`
            self._record_divergence(loss.item())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.train.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.loss_sum += loss.detach()
        self.loss_count += 1

    def _draw_depth(self) -> int | None:
        low = self.cfg.model.min_depth
        if low is None:
            return None
        return int(torch.randint(low, self.cfg.model.n_layers + 1, (1,), generator=self.depth_gen))

    def _check_finite(self) -> None:
        """The divergence check of a GPU run, where the loss is not read every step: at each
        evaluation and before each checkpoint, so no NaN weights are ever saved; the recorded
        step is then the first evaluation or checkpoint after the loss became NaN."""
        total = self.loss_sum.item()
        if not math.isfinite(total):
            self._record_divergence(total)

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
        logits = torch.cat([forward(self.model, batch.tokens[i : i + EVAL_CHUNK])
                            for i in range(0, len(batch), EVAL_CHUNK)])
        picked = logits_at_labels(logits, batch.label_pos)
        scored = batch.label_mask & batch.loss_mask if batch.loss_mask.any() else batch.label_mask
        eval_loss = F.cross_entropy(picked[scored], batch.labels[scored]).item()
        record = {
            "step": self.step, "lr": learning_rate(self.step - 1, self.cfg.train),
            "train_loss": self.loss_sum.item() / max(1, self.loss_count), "eval_loss": eval_loss,
            "elapsed_s": round(self.elapsed, 2), **self.task.accuracy(batch.to("cpu"), picked.argmax(-1).cpu()),
        }
        self.loss_sum.zero_()
        self.loss_count = 0
        if self.snapshots is not None:
            events = self.snapshots.at_evaluation(self.step, record, unique_parameters(self.model))
            if events:
                record["snapshot_events"] = events
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
        progress = Progress(self.step, self.elapsed, self.loss_sum.item(), self.loss_count)
        self.folder.save_checkpoint(progress, unique_parameters(self.model), self.optimizer.state_dict()["state"],
                                    self.generators)

    def _restore(self) -> None:
        """Continue from the folder's checkpoint. Its train state is the truth: a weights file that
        is missing, damaged or of another step is rewritten from it. A folder with a config but no
        train state (a crash before the first checkpoint) starts again from step 0."""
        checkpoint = self.folder.resume_point(self.cfg.train.steps, self.cfg.train.eval_every)
        if checkpoint is None:
            self._begin_at_step_0()
            return
        load_weights(self.model, checkpoint.weights, source=checkpoint.path)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = checkpoint.optimizer_state(params, self.device)
        self.optimizer.load_state_dict({"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]})
        checkpoint.restore_generators(self.generators)
        checkpoint.check_digest()  # after the checks by field, which name what is wrong
        progress = checkpoint.progress
        self.step, self.elapsed, self.loss_count = progress.step, progress.elapsed, progress.loss_count
        self.loss_sum.fill_(progress.loss_sum)
        self.folder.restore_weights_file(checkpoint)
        self.folder.drop_metrics_after(self.step)
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
        Trainer(cfg, folder, resume=folder.has_checkpoint(), progress=progress).fit()
    return load_run(folder.path)
