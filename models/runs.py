"""The run folder: config, weights, resumable train state and metrics, written atomically and
without pickle (safetensors for tensors, JSON for the rest)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import platform
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from models.config import RunConfig
from tasks import ConfigError, Task, make_task

CONFIG, WEIGHTS, TRAIN_STATE, METRICS = "config.json", "model.safetensors", "train_state.safetensors", "metrics.jsonl"
MIMIC = "mimic.json"  # losses of mimicking pre-training, when the run had any
INIT = "init.json"  # where the starting weights came from, when `train.init_from` named a run
ANALYSIS, REPORT = "analysis.json", "report.html"
LOCK = ".workbench.lock"  # present while a process writes the folder (holds its pid)
DEMO = "demo.json"  # written by `workbench demo`: the config of its run, which marks the folder as the demo's
ERROR_LOG = "workbench-error.log"  # the traceback of a command's unexpected error (analyses/cli.py)
RUN_FILES = {CONFIG, WEIGHTS, TRAIN_STATE, METRICS, MIMIC, INIT, ANALYSIS, REPORT, LOCK, DEMO, ERROR_LOG}  # what a run folder may hold
PACKAGES = ("interp-workbench", "torch", "transformer-lens", "circuitsvis", "numpy")


class RunFolderError(ConfigError):
    """A run folder's file is unreadable or inconsistent, or another process writes the folder.
    The message names the file and what is wrong; the CLI exits 2."""


_HELD: dict[Path, tuple[int, int]] = {}  # folder -> (lock fd, re-entry count), this process's locks


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the folder's write lock: one writer per run folder. Taken before anything is written
    (the folder is created if needed) and released on exit, however the block ends. A second
    writer gets RunFolderError naming the holder's pid. A lock left by a killed process is free
    again (the kernel drops flock locks with their process), so it is taken over. Re-entrant
    within one process. POSIX only (fcntl.flock)."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _HELD:
        fd, count = _HELD[run_dir]
        _HELD[run_dir] = (fd, count + 1)
        try:
            yield
        finally:
            fd, count = _HELD[run_dir]
            _HELD[run_dir] = (fd, count - 1)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = _acquire(run_dir / LOCK)
    _HELD[run_dir] = (fd, 1)
    try:
        yield
    finally:
        del _HELD[run_dir]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir / LOCK)  # unlinked while still locked: a waiting opener retries on the new file
        os.close(fd)


def writer_pid(run_dir: str | Path) -> str | None:
    """The pid of the process writing the folder (holding its lock), or None: readers use it to
    warn that they see a run still in training."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # closing drops the shared lock if we got it
    return None


def _holder(fd: int) -> str:
    """The pid a lock file holds (written by its holder in `_acquire`)."""
    return os.read(fd, 64).decode(errors="replace").strip() or "unknown"


def _acquire(path: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the empty folder was removed under us (another writer's --out check): again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise RunFolderError(f"{path} is a symbolic link; the workbench never writes through one (it would write "
                                 f"its pid into whatever the link points to). Remove the link, then try again") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunFolderError(f"{path.parent} is being written by another process (pid {holder}); wait for it "
                                 f"to finish or stop it, then try again") from None
        try:
            same_file = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:  # not a file its last holder unlinked after we opened it
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)  # "could not write"


def _fresh_temp(path: Path) -> tuple[Path, int]:
    """A new temporary sibling for one write (its name unique to this write, so two writers of
    one file never touch each other's), created with O_EXCL | O_NOFOLLOW: never a link, never
    someone else's file. Returns its path and an open descriptor."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            continue
        except OSError as err:
            raise _naming(err, path) from None


def _naming(err: OSError, path: Path) -> OSError:
    """`err` with the file it was about: a full disk reported by write() or close() names none."""
    return err if err.filename else OSError(err.errno, err.strerror, str(path))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a new temporary sibling, then rename it over `path`: a killed process leaves the
    old file whole, and nothing is written through a symbolic link (a rename replaces a link at
    `path` itself, not its target)."""
    tmp, fd = _fresh_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise _naming(err, path) from None
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line to a file of the run's own (metrics.jsonl), never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RunFolderError(f"{path} is a symbolic link; the workbench never writes through one. Remove it") from None
        raise _naming(err, path) from None
    try:
        with os.fdopen(fd, "a") as f:
            f.write(line + "\n")
    except OSError as err:
        raise _naming(err, path) from None


def save_tensors(path: Path, tensors: dict[str, Tensor], meta: dict[str, str] | None = None) -> None:
    tmp, fd = _fresh_temp(path)
    os.close(fd)  # safetensors writes the file by its name
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)
        os.chmod(tmp, 0o644)  # like the folder's other files (safetensors creates 0600)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        code = next((c for c in WRITE_ERRNOS if os.strerror(c) in str(err)), None)
        if code is not None and not isinstance(err, OSError):  # safetensors' own error for a full disk, a denied write
            raise OSError(code, os.strerror(code), str(path)) from err
        if isinstance(err, OSError):
            raise _naming(err, path) from None
        raise


def weights_digest(tensors: dict[str, Tensor]) -> str:
    """sha256 over the tensors' names and bytes: the weights file and the train state carry it,
    so resume can tell whether the weights file is the checkpoint's."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def read_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; RunFolderError when it is damaged."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (a safetensors handle, not a dict)
    except FileNotFoundError:
        raise RunFolderError(f"{path} does not exist") from None
    except Exception as err:  # safetensors raises its own SafetensorError and OSError variants
        raise RunFolderError(f"{path} is damaged ({type(err).__name__}: {err})") from None


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
            raise RunFolderError(f"{path}: meta.{name}={raw[name]!r} is not {kind}; the train state is damaged") from None
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    missing = [name for name in ("rng.data", "rng.depth") if name not in tensors] + ([] if weights else ["model.*"])
    if missing:
        raise RunFolderError(f"{path} lacks {', '.join(missing)}; it is damaged or was not written by this workbench")
    if weights_digest(weights) != meta["digest"]:
        raise RunFolderError(f"{path}: its weights do not match the digest stored with them (meta.digest); the train "
                             f"state is corrupt and resuming it would continue from wrong weights")
    meta["state_digest"] = raw.get("state_digest")  # over every tensor; in train states written since 2026-11-26
    return tensors, meta


def check_state_digest(path: Path, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """RunFolderError unless every tensor of a train state (optimizer moments and random
    generators too, not only the weights) hashes to its meta.state_digest, where it has one.
    Resume calls it after its checks by field, whose messages say more."""
    if meta.get("state_digest") is not None and weights_digest(tensors) != meta["state_digest"]:
        raise RunFolderError(f"{path}: its tensors (optimizer moments, random generators) do not match the digest "
                             f"stored with them (meta.state_digest); the train state is corrupt")


MAX_JSON_DEPTH = 64  # nesting no file of the workbench comes near; deeper is damage, not data


def read_json(path: Path, text: str | None = None) -> Any:
    """A JSON file of the run folder, read strictly: RunFolderError naming the file when it is
    unreadable or not JSON, when an object repeats a key (`"steps"` twice: which one was
    meant?), or when it nests deeper than MAX_JSON_DEPTH. `text`: its content, already read."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise RunFolderError(f"{path} repeats the key {key!r} in one object; which value is meant is "
                                     f"ambiguous, so it is refused. Keep one {key!r}")
            seen[key] = value
        return seen

    try:
        text = path.read_text() if text is None else text
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as err:
        raise RunFolderError(f"{path} is unreadable ({err})") from None
    if _nesting(text) > MAX_JSON_DEPTH:
        raise RunFolderError(f"{path} nests deeper than {MAX_JSON_DEPTH} levels; it is damaged or not the workbench's")
    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise RunFolderError(f"{path} is not JSON ({err})") from None


def _nesting(text: str) -> int:
    """The deepest bracket nesting of a JSON text, counted outside strings (no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (escaped or char != '"')
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    payload = {**cfg.to_dict(), "versions": package_versions()}
    atomic_write_bytes(run_dir / CONFIG, json.dumps(payload, indent=2).encode())


def read_config(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / CONFIG
    if not path.exists() and not path.is_symlink():
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
    if not path.exists():
        return []
    lines = [(number, line) for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()]
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
            raise RunFolderError(f"{path}: line {number} is damaged ({err}); only a damaged last line can be dropped") from None
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
    has_state = state.exists() or state.is_symlink()
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


def repair_weights(run_dir: str | Path) -> WeightsStamp:
    """Rewrite the weights file from the train state, with a warning. Call it holding the
    folder's lock; RunFolderError when the train state itself is damaged."""
    run_dir = Path(run_dir)
    tensors, meta = read_train_state(run_dir / TRAIN_STATE)
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    save_tensors(run_dir / WEIGHTS, weights, {"step": str(meta["step"]), "digest": meta["digest"]})
    return WeightsStamp(meta["step"], meta["digest"])


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


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is a failed allocation: torch.OutOfMemoryError (a GPU), or the CPU allocator's."""
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


def model_sizes(cfg: RunConfig) -> str:
    """The model's sizes as settings, for a message about memory."""
    m = cfg.model
    return (f"model.d_model={m.d_model}, model.d_mlp={m.mlp_dim}, model.d_head={m.head_dim}, model.n_heads={m.n_heads}, "
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
    holder = None if run_dir.resolve() in _HELD else writer_pid(run_dir)  # this process's own lock: no warning
    if holder is not None:
        warnings.warn(f"{run_dir} is being trained by pid {holder}; loading its last checkpoint, not its final weights",
                      stacklevel=2)
    if not (run_dir / WEIGHTS).exists():
        raise RunFolderError(f"{run_dir / WEIGHTS} does not exist; train the run first (workbench train --out {run_dir})")
    cfg = read_config(run_dir)
    task = make_task(cfg.task)
    try:
        model = build_model(cfg.model, task, seed=cfg.train.seed, device=device)
    except RuntimeError as err:  # a hand-edited size: say which, rather than the allocator's traceback
        if not out_of_memory(err):
            raise
        raise RunFolderError(f"{run_dir / CONFIG}: its model does not fit in memory ({str(err).splitlines()[0][:200]}); "
                             f"its sizes: {model_sizes(cfg)}. Was config.json edited? Its model section must be "
                             f"the one model.safetensors was trained with") from None
    try:
        tensors, stamp = verified_weights(run_dir)
    except WeightsMismatch as err:
        raise WeightsMismatch(f"{err}. `workbench train --out {run_dir} --resume` rewrites it from the train state") from None
    load_weights(model, tensors)
    model.eval()
    return LoadedRun(run_dir, cfg, task, model, read_metrics(run_dir), stamp)


def load_weights(model: torch.nn.Module, tensors: dict[str, Tensor], source: str | Path = "the weights file") -> None:
    """Copy `tensors` into the model's parameters; RunFolderError naming `source` when one is
    missing or of another shape."""
    from models.factory import unique_parameters

    params = unique_parameters(model)
    missing = set(params) - set(tensors)
    if missing:
        raise RunFolderError(f"{source} lacks {sorted(missing)[:5]}...; was it written for another config?")
    wrong = {name: (tuple(tensors[name].shape), tuple(p.shape)) for name, p in params.items() if tensors[name].shape != p.shape}
    if wrong:
        listed = ", ".join(f"{name} {theirs} vs {ours}" for name, (theirs, ours) in list(wrong.items())[:3])
        raise RunFolderError(f"{source} holds weights of another shape than the config's model ({listed}); was it "
                             f"written for another config?")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name])
