"""The run folder: what it holds and how each file is written and read, in one place. Config,
weights, resumable train state and metrics, written atomically and without pickle (safetensors
for tensors, JSON for the rest; the primitives are in models/safe_files.py).

The folder as its writers see it (`RunFolder`: whether it may receive a new run, its lock,
checkpoints saved and resumed) is in models/run_folder.py; the trainer and the command line ask
it and name none of its files. Readers (`run_state`, `verified_weights`,
`load_run`) check what they read."""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from models.config import RunConfig
from models.safe_files import (
    LOCK,
    RunFolderError,
    atomic_write_bytes,
    locked_here,
    present,
    read_json,
    read_regular,
    read_tensors,
    run_lock,
    save_tensors,
    writer_pid,
)
from tasks import ConfigError, Task, make_task

CONFIG, WEIGHTS, TRAIN_STATE, METRICS = "config.json", "model.safetensors", "train_state.safetensors", "metrics.jsonl"
MIMIC = "mimic.json"  # losses of mimicking pre-training, when the run had any
INIT = "init.json"  # where the starting weights came from, when `train.init_from` named a run
ANALYSIS, REPORT = "analysis.json", "report.html"
DEMO = "demo.json"  # written by `workbench demo`: the config of its run, which marks the folder as the demo's
ERROR_LOG = "workbench-error.log"  # the traceback of a command's unexpected error (analyses/cli/guards.py)
TIMELINE = "timeline.json"  # written by `workbench analyze --timeline` (interp/timeline.py)
SNAPSHOTS = "snapshots"  # snapshots of the weights along the way, with their index (models/snapshots.py)
STATES = "states"  # whole training states kept for a replay (`train.keep_state`, event snapshots)
RUN_FILES = {CONFIG, WEIGHTS, TRAIN_STATE, METRICS, MIMIC, INIT, ANALYSIS, REPORT, LOCK, DEMO, ERROR_LOG, SNAPSHOTS,
             TIMELINE, STATES}  # what a run folder may hold
PACKAGES = ("interp-workbench", "torch", "transformer-lens", "circuitsvis", "numpy")
ADAMW_STATE = {"step", "exp_avg", "exp_avg_sq"}  # what AdamW keeps per parameter (optim.<index>.<name>)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def weights_digest(tensors: dict[str, Tensor]) -> str:
    """sha256 over the tensors' names and bytes: the weights file and the train state carry it,
    so resume can tell whether the weights file is the checkpoint's."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _count(text: str) -> int:
    if int(text) < 0:
        raise ValueError
    return int(text)


def _finite(text: str) -> float:
    if not math.isfinite(float(text)):
        raise ValueError
    return float(text)


def _sha256(text: str) -> str:
    if not re.fullmatch("[0-9a-f]{64}", text):
        raise ValueError
    return text


# a train state's metadata: field -> (parser, what the field must be)
TRAIN_STATE_META = {"step": (_count, "an integer >= 0"), "elapsed": (_finite, "a finite number"),
                    "loss_sum": (_finite, "a finite number"), "loss_count": (_count, "an integer >= 0"),
                    "digest": (_sha256, "a sha256 hex digest")}


def read_train_state(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A train state's tensors and its parsed metadata (TRAIN_STATE_META). RunFolderError naming
    the file and the field when a field is missing or malformed, or when the weights in it do not
    match the digest stored with them: a train state that contradicts itself is never resumed."""
    tensors, raw = read_tensors(path)
    meta = {}
    for name, (parse, kind) in TRAIN_STATE_META.items():
        if name not in raw:
            raise RunFolderError(f"{path} lacks meta.{name}; it is damaged or was not written by this workbench")
        try:
            meta[name] = parse(raw[name])
        except ValueError:
            raise RunFolderError(f"{path}: meta.{name}={raw[name]!r} is not {kind}; "
                                 "the train state is damaged") from None
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    missing = [name for name in ("rng.data", "rng.depth") if name not in tensors] + ([] if weights else ["model.*"])
    if missing:
        raise RunFolderError(f"{path} lacks {', '.join(missing)}; it is damaged or was not written by this workbench")
    if weights_digest(weights) != meta["digest"]:
        raise RunFolderError(f"{path}: its weights do not match the digest stored with them (meta.digest); the train "
                             f"state is corrupt and resuming it would continue from wrong weights")
    meta["state_digest"] = raw.get("state_digest")  # over every tensor; in train states written since 2026-11-26
    return tensors, meta


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    payload = {**cfg.to_dict(), "versions": package_versions()}
    atomic_write_bytes(run_dir / CONFIG, json.dumps(payload, indent=2).encode())


def read_config(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / CONFIG
    if not present(path):
        raise RunFolderError(f"{path} does not exist; {run_dir} holds no run")
    return read_config_file(path)


def read_config_file(path: Path) -> RunConfig:
    """A run configuration from a JSON file (a run's config.json, or `train --config FILE`),
    read strictly; RunFolderError (exit 2) naming the file and what is wrong."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise RunFolderError(f"{path} does not exist") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path} is not a JSON object with task, model and train sections")
    data.pop("versions", None)
    try:
        return RunConfig.from_dict(data)
    except RunFolderError:
        raise
    except ConfigError as err:  # a hand-edited value: say which file holds it
        raise RunFolderError(f"{path}: {err}") from None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of metrics.jsonl. A damaged last line (what a crash in mid-write leaves) is
    dropped with a warning; a damaged earlier line is a RunFolderError naming it."""
    path = Path(run_dir) / METRICS
    try:
        text = read_regular(path).decode(errors="replace")
    except FileNotFoundError:
        return []
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(lines):
        try:
            record = read_json(path, line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a record with an integer step")
        except (ValueError, RunFolderError) as err:
            if index == len(lines) - 1:
                warnings.warn(f"{path}: dropped its damaged last line {number} ({err})", stacklevel=2)
                break
            raise RunFolderError(f"{path}: line {number} is damaged ({err}); "
                                 "only a damaged last line can be dropped") from None
        records.append(record)
    return records


def same_recipe(a: RunConfig, b: RunConfig) -> bool:
    """Whether two configs train the same run: equal, with `train.init_from` compared as the
    folder it names (`runs/a` and its absolute path are one source)."""
    def canonical(cfg: RunConfig) -> dict:
        data = cfg.to_dict()
        source = data["train"].get("init_from")
        if source is not None:
            data["train"] = {**data["train"], "init_from": str(Path(source).resolve())}
        return data
    return canonical(a) == canonical(b)


class WeightsMismatch(RunFolderError):
    """The weights file is not the train state's: missing, damaged (its tensors do not hash to
    the digest in its header) or stale (the weights of an earlier step: a kill between the
    checkpoint's two writes). A writer repairs it from the train state (`repair_weights`); a
    reader refuses it."""


@dataclass(frozen=True)
class WeightsStamp:
    """Which weights a folder holds, as verified: the step they were saved at and the sha256 of
    their tensors, computed from the bytes (not read from a header)."""

    step: int
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "digest": self.digest}


def verified_weights(run_dir: str | Path) -> tuple[dict[str, Tensor], WeightsStamp]:
    """The folder's weights and their stamp, checked: the tensors must hash to the digest their
    header records and, where the folder has a train state, to the train state's digest (the
    truth for a run in training or resumed). WeightsMismatch (exit 2) naming the file otherwise:
    missing, damaged or stale. The one check every reader of weights goes through."""
    run_dir = Path(run_dir)
    path, state = run_dir / WEIGHTS, run_dir / TRAIN_STATE
    has_state = present(state)
    try:
        tensors, meta = read_tensors(path)
    except RunFolderError as err:
        raise (WeightsMismatch(str(err)) if has_state else err) from None
    digest = weights_digest(tensors)
    step = meta.get("step", "")
    if meta.get("digest") != digest or not step.isdigit():
        problem = ("carries no weights digest in its header, so its tensors cannot be verified"
                   if "digest" not in meta else "is damaged: its tensors do not hash to the digest in its header")
        raise (WeightsMismatch if has_state else RunFolderError)(f"{path} {problem}")
    if has_state:
        _, state_meta = read_train_state(state)
        if state_meta["digest"] != digest:
            raise WeightsMismatch(f"{path} holds the weights of step {step}, not those of the train state's step "
                                  f"{state_meta['step']} ({TRAIN_STATE}): it is stale")
    return tensors, WeightsStamp(int(step), digest)


def save_weights(run_dir: Path, weights: dict[str, Tensor], stamp: WeightsStamp) -> None:
    """The weights file: the tensors, their step and digest in its header (what `verified_weights`
    checks them against)."""
    save_tensors(run_dir / WEIGHTS, weights, {"step": str(stamp.step), "digest": stamp.digest})


def repair_weights(run_dir: str | Path) -> WeightsStamp:
    """Rewrite the weights file from the train state. Call it holding the folder's lock (the
    caller warns); RunFolderError when the train state itself is damaged."""
    checkpoint = Checkpoint.read(Path(run_dir) / TRAIN_STATE)
    save_weights(Path(run_dir), checkpoint.weights, checkpoint.stamp)
    return checkpoint.stamp


def run_state(run_dir: Path, cfg: RunConfig, repair: bool = True) -> str:
    """Where a run folder stands for `cfg`: `done`, `diverged` (its last record says so),
    `partial` (a checkpoint to resume from) or `new`.

    `done` means the metrics reach the last step (or a stop rule's stop), the train state, where
    there is one, is at that step, and the weights pass `verified_weights`. Weights that are
    missing, damaged or stale beside a finished train state are rewritten from it (`repair`,
    with a warning, under the folder's lock) or, with `repair=False`, raise WeightsMismatch. A
    train state behind the metrics (a kill after an evaluation was recorded, before its
    checkpoint) is `partial`: resuming drops the records after it."""
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    if metrics and metrics[-1].get("diverged"):
        return "diverged"
    has_state = (run_dir / TRAIN_STATE).exists()
    last = metrics[-1] if metrics else {}
    finished = bool(last) and (last.get("step") == cfg.train.steps or bool(last.get("stopped")))
    if has_state and finished and read_train_state(run_dir / TRAIN_STATE)[1]["step"] != last["step"]:
        return "partial"
    if finished and (has_state or (run_dir / WEIGHTS).exists()):
        try:
            verified_weights(run_dir)
        except WeightsMismatch as err:
            if not repair:
                raise
            with run_lock(run_dir):
                warnings.warn(f"{err}; rewritten from {run_dir / TRAIN_STATE}", stacklevel=2)
                repair_weights(run_dir)
        return "done"
    return "partial" if has_state else "new"


@dataclass(frozen=True)
class Progress:
    """Where training stands at a checkpoint: steps taken, seconds spent, and the training loss
    summed over the steps since the last evaluation (`loss_count` of them)."""

    step: int
    elapsed: float
    loss_sum: float
    loss_count: int


@dataclass(frozen=True)
class Moment:
    """A run's whole training state at one step: where training stands, the weights, AdamW's
    state by parameter index (as torch's AdamW numbers it) and the random generators' states."""

    progress: Progress
    weights: dict[str, Tensor]
    optimizer: dict[int, dict[str, Any]]
    generators: dict[str, Tensor]

    def tensors(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        """The train state's tensors (model.*, optim.*, rng.*) and metadata."""
        tensors = {f"model.{k}": v for k, v in self.weights.items()}
        for index, state in self.optimizer.items():
            tensors.update({f"optim.{index}.{k}": torch.as_tensor(v) for k, v in state.items()})
        tensors.update({f"rng.{name}": state for name, state in self.generators.items()})
        progress = self.progress
        meta = {"step": str(progress.step), "digest": weights_digest(self.weights), "elapsed": repr(progress.elapsed),
                "loss_sum": repr(progress.loss_sum), "loss_count": str(progress.loss_count),
                "state_digest": weights_digest(tensors)}
        return tensors, meta


@dataclass(frozen=True)
class Checkpoint:
    """A train state as read by `read_train_state` (every field present and parsed, the weights
    matching their digest): the model's weights (model.<name>), AdamW's moments per parameter
    (optim.<index>.<name>), the random generators' states (rng.<name>) and the `Progress`."""

    path: Path
    tensors: dict[str, Tensor]
    meta: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> Checkpoint:
        return cls(path, *read_train_state(path))

    @property
    def weights(self) -> dict[str, Tensor]:
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}

    @property
    def stamp(self) -> WeightsStamp:
        return WeightsStamp(self.meta["step"], self.meta["digest"])

    @property
    def progress(self) -> Progress:
        meta = self.meta
        return Progress(meta["step"], meta["elapsed"], meta["loss_sum"], meta["loss_count"])

    def optimizer_state(self, params: list[torch.nn.Parameter], device: torch.device) -> dict[int, dict[str, Tensor]]:
        """AdamW's state by parameter index, on `device`, checked against `params` (the
        optimizer's, in its order). A parameter that never had a gradient, like a block
        stochastic depth skipped, has none."""
        state: dict[int, dict[str, Tensor]] = {}
        for key, value in self.tensors.items():
            if key.startswith("optim."):
                index, _, name = key[len("optim."):].partition(".")
                if not index.isdigit() or int(index) >= len(params):
                    raise RunFolderError(f"{self.path}: {key} belongs to no parameter of this model "
                                         f"({len(params)} parameters)")
                state.setdefault(int(index), {})[name] = value if name == "step" else value.to(device)
        for index, entry in state.items():
            if set(entry) != ADAMW_STATE:
                raise RunFolderError(f"{self.path}: optim.{index} holds {sorted(entry)}, "
                                     f"not AdamW's {sorted(ADAMW_STATE)}")
            for name in ("exp_avg", "exp_avg_sq"):
                if entry[name].shape != params[index].shape:
                    raise RunFolderError(f"{self.path}: optim.{index}.{name} has shape {tuple(entry[name].shape)}, its "
                                         f"parameter {tuple(params[index].shape)}")
        return state

    def restore_generators(self, generators: dict[str, torch.Generator]) -> None:
        """Set each generator to its saved state (rng.<name>)."""
        for name, gen in generators.items():
            try:
                gen.set_state(self.tensors[f"rng.{name}"])
            except (RuntimeError, TypeError) as err:
                raise RunFolderError(f"{self.path}: rng.{name} is not a random generator's state ({err})") from None

    def check_digest(self) -> None:
        """RunFolderError unless every tensor (optimizer moments and random generators too, not
        only the weights) hashes to meta.state_digest, where the file has one. Resume calls it
        after the checks by field, whose messages say more."""
        expected = self.meta.get("state_digest")
        if expected is not None and weights_digest(self.tensors) != expected:
            raise RunFolderError(f"{self.path}: its tensors (optimizer moments, random generators) do not match the "
                                 f"digest stored with them (meta.state_digest); the train state is corrupt")


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is a failed allocation: torch.OutOfMemoryError (a GPU), or the CPU allocator's."""
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


def model_sizes(cfg: RunConfig) -> str:
    """The model's sizes as settings, for a message about memory."""
    m = cfg.model
    return (f"model.d_model={m.d_model}, model.d_mlp={m.mlp_dim}, model.d_head={m.head_dim}, "
            f"model.n_heads={m.n_heads}, "
            f"model.n_layers={m.n_layers}, model.n_ctx={m.n_ctx}")


@dataclass
class LoadedRun:
    """A trained run, ready for analysis: config, task, model (eval mode) and metrics."""

    path: Path
    config: RunConfig
    task: Task
    model: Any  # HookedTransformer; typed loosely so tasks-only users need not import it
    metrics: list[dict[str, Any]]
    weights: WeightsStamp | None = None  # the step and digest of the weights loaded (verified)


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Rebuild the model of a run folder on `device` and load its weights (saved from any device)."""
    from models.factory import build_model

    run_dir = Path(run_dir)
    holder = None if locked_here(run_dir) else writer_pid(run_dir)  # this process's own lock: no warning
    if holder is not None:
        warnings.warn(f"{run_dir} is being trained by pid {holder}; loading its last checkpoint, not its final weights",
                      stacklevel=2)
    if not (run_dir / WEIGHTS).exists():
        raise RunFolderError(f"{run_dir / WEIGHTS} does not exist; "
                             f"train the run first (workbench train --out {run_dir})")
    cfg = read_config(run_dir)
    task = make_task(cfg.task)
    try:
        model = build_model(cfg.model, task, seed=cfg.train.seed, device=device)
    except RuntimeError as err:  # a hand-edited size: say which, rather than the allocator's traceback
        if not out_of_memory(err):
            raise
        raise RunFolderError(f"{run_dir / CONFIG}: its model does not fit in memory "
                             f"({str(err).splitlines()[0][:200]}); "
                             f"its sizes: {model_sizes(cfg)}. Was config.json edited? Its model section must be "
                             f"the one model.safetensors was trained with") from None
    try:
        tensors, stamp = verified_weights(run_dir)
    except WeightsMismatch as err:
        raise WeightsMismatch(f"{err}. `workbench train --out {run_dir} --resume` "
                              "rewrites it from the train state") from None
    load_weights(model, tensors)
    model.eval()
    return LoadedRun(run_dir, cfg, task, model, read_metrics(run_dir), stamp)


def non_finite_weights(model: torch.nn.Module) -> list[str]:
    """The names of the model's parameters that hold NaN or infinity (none for a sane model): such
    a model computes NaN, and an analysis of it must say so rather than present numbers."""
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


def non_finite_note(places: list[list[str | int]], weights: list[str]) -> dict[str, Any]:
    """What analysis.json says where it replaced NaN or infinite values by null (strict JSON):
    why where it is known (weights that are not numbers), how many, and every place (its keys and
    indices; `models.safe_files.nan_at` puts NaN back there for a reader that wants numbers)."""
    if weights:
        why = (f"the model's weights hold NaN or infinity ({len(weights)} parameters, e.g. {', '.join(weights[:3])}), "
               f"so what it computes is not a number: the values below that depend on it are null, and its labels and "
               f"verdict mean nothing. Retrain the run, or resume it from a checkpoint before the weights broke")
    else:
        why = "these values were undefined (NaN or infinity, e.g. a correlation of constant scores) and are null"
    return {"statement": why, "count": len(places), "where": places, "weights": weights}


def load_weights(model: torch.nn.Module, tensors: dict[str, Tensor], source: str | Path = "the weights file") -> None:
    """Copy `tensors` into the model's parameters; RunFolderError naming `source` when one is
    missing or of another shape."""
    from models.factory import unique_parameters

    params = unique_parameters(model)
    missing = set(params) - set(tensors)
    if missing:
        raise RunFolderError(f"{source} lacks {sorted(missing)[:5]}...; was it written for another config?")
    wrong = {name: (tuple(tensors[name].shape), tuple(p.shape)) for name, p in params.items()
             if tensors[name].shape != p.shape}
    if wrong:
        listed = ", ".join(f"{name} {theirs} vs {ours}" for name, (theirs, ours) in list(wrong.items())[:3])
        raise RunFolderError(f"{source} holds weights of another shape than the config's model ({listed}); was it "
                             f"written for another config?")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name])
