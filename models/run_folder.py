"""The run folder as its writers see it (`RunFolder`): whether it may receive a new run, its lock,
the start of a run, metrics one evaluation at a time, checkpoints saved and resumed. The readers
and the file formats are in models/runs.py, which this module builds on."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from models import runs
from models.config import RunConfig
from models.runs import (
    CONFIG,
    DEMO,
    INIT,
    METRICS,
    MIMIC,
    RUN_FILES,
    SNAPSHOTS,
    STATES,
    TRAIN_STATE,
    Checkpoint,
    Moment,
    WeightsMismatch,
    WeightsStamp,
    read_config,
    read_metrics,
    verified_weights,
    write_config,
)
from models.safe_files import LOCK, RunFolderError, append_line, atomic_write_bytes, is_own_temp, run_lock, save_tensors
from models.snapshots import copy_snapshots, remove_snapshots
from tasks import ConfigError

_MOMENT = re.compile(r"step-(\d{8})\.safetensors")


def moment_file(step: int) -> str:
    return f"step-{step:08d}.safetensors"


class RunFolder:
    """One run folder as its writers (the trainer, the command line) see it: whether it may
    receive a new run, its lock, the start of a run, metrics one evaluation at a time, and
    checkpoints saved and resumed. `named_by`: the command-line option that gave the folder
    ("--out"); messages about the folder then name it so."""

    def __init__(self, path: str | Path, named_by: str = ""):
        self.path, self.named_by = Path(path), named_by

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def label(self) -> str:
        """How messages name the folder: `--out runs/x` when the command line gave it, else its path."""
        return f"{self.named_by} {self.path}" if self.named_by else str(self.path)

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS

    def holds_run(self) -> bool:
        """Whether a run was started here (it has a config.json)."""
        return (self.path / CONFIG).exists()

    def has_checkpoint(self) -> bool:
        return (self.path / TRAIN_STATE).exists()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The folder's write lock (`run_lock`), taken by every trainer before it writes; then the
        check that no write would go through a link (`check_no_folder_links`)."""
        with run_lock(self.path):
            self.check_no_folder_links()
            yield

    def check_no_folder_links(self) -> None:
        """RunFolderError naming an entry that is a symbolic link to a folder (`snapshots/`, or any
        other): a write into it would land in the folder it points to, another run's perhaps. A
        link in place of a file is not refused: the rename that writes the file replaces the link."""
        for entry in os.scandir(self.path):
            if entry.is_symlink() and (entry.name == SNAPSHOTS or entry.is_dir()):
                raise RunFolderError(f"{entry.path} is a symbolic link (to {os.readlink(entry.path)}); the workbench "
                                     f"never writes through one. Replace it with a folder of its own, then try again")

    def check_usable(self) -> None:
        """A folder to start a run in must be new, empty, or a run folder with nothing but run
        files (which `check_receives` then refuses and `workbench demo` replaces): never a file,
        the current folder by an empty name, or a folder holding someone's other files. The
        temporary files of a killed writer (`is_own_temp`) are the run's own: the trainer's lock
        removes them."""
        out = self.path
        if not self.check_place("the run"):
            return
        names = [p.name for p in out.iterdir() if not is_own_temp(p.name)]  # a killed writer's temp files: its own
        others = sorted(name for name in names if name not in RUN_FILES)
        if others or (any(name != LOCK for name in names) and not self.holds_run()):
            listed = ", ".join(others[:5]) or "run files without a config.json"
            raise ConfigError(f"{self.label} holds files that are not a run's ({listed}); choose a new or empty folder")

    def check_place(self, purpose: str) -> bool:
        """Refuse an empty name or '.', a file, or a new folder that cannot be made (`purpose`, e.g.
        "the run", completes the messages); return whether the folder exists already."""
        if str(self.path) in ("", "."):
            raise ConfigError(f"{self.named_by or 'the run folder'} is empty or '.'; name a folder for {purpose}, "
                              f"e.g. --out runs/x")
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"{self.label} is a file, not a folder; choose a folder for {purpose}")
        if not self.path.exists():
            self.check_creatable()
            return False
        return True

    def check_creatable(self) -> None:
        """Create the folder and remove it again (with the parents that did not exist), so that a
        folder that cannot be made is refused before anything runs, and nothing is left when a
        later check refuses the run."""
        missing = [self.path, *[p for p in self.path.parents if not p.exists()]]
        try:
            self.path.mkdir(parents=True)
        except FileExistsError:
            return  # another writer made it meanwhile: the run lock decides which of the two trains
        except OSError as err:
            raise ConfigError(f"{self.label} cannot be created ({err.strerror}); "
                              "choose a folder you can write") from None
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def check_receives(self, cfg: RunConfig | None = None) -> None:
        """The one rule for a new run: a folder that holds a run (a config.json) receives no other,
        so that no run is ever overwritten. The exception is a run of this same `cfg` that stopped
        before its first checkpoint (a config, no train state), which the trainer starts again;
        without `cfg` there is none (the command line, which points at --resume instead). The
        trainer asks again under the lock: a run another process wrote meanwhile is refused."""
        if not self.holds_run():
            return
        if cfg is not None and read_config(self.path).to_dict() == cfg.to_dict() and not self.has_checkpoint():
            return
        raise RunFolderError(f"{self.label} already holds a run; use --resume to continue it or choose another folder")

    def start(self, cfg: RunConfig) -> None:
        """A new run of `cfg`: the folder (made if needed) and its config.json."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_config(self.path, cfg)

    def clear_metrics(self) -> None:
        atomic_write_bytes(self.path / METRICS, b"")

    def write_init(self, record: dict[str, Any]) -> None:
        """Where the starting weights came from (`train.init_from`)."""
        atomic_write_bytes(self.path / INIT, json.dumps(record, indent=1).encode())

    def write_mimic(self, record: dict[str, Any]) -> None:
        """The losses of mimicking pre-training (`train.mimic_steps`)."""
        atomic_write_bytes(self.path / MIMIC, json.dumps(record).encode())

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_line(self.path / METRICS, json.dumps(record))

    def metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def drop_metrics_after(self, step: int) -> None:
        """metrics.jsonl without the records after `step` (a resumed run records them again) and
        without a divergence record."""
        kept = [r for r in self.metrics() if r["step"] <= step and not r.get("diverged")]
        atomic_write_bytes(self.path / METRICS, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def save_checkpoint(self, moment: Moment) -> None:
        """The train state (weights, AdamW's state by parameter index, the generators' states),
        replaced atomically; then the weights file. Both carry the step and the weights' digest,
        so resume can tell a weights file that is not the checkpoint's (a kill between the two
        writes) and restore it; the train state's state_digest covers every tensor."""
        tensors, meta = moment.tensors()
        save_tensors(self.path / TRAIN_STATE, tensors, meta)
        runs.save_weights(self.path, moment.weights, WeightsStamp(moment.progress.step, meta["digest"]))

    def keep_moment(self, moment: Moment) -> Path:
        """The whole training state of `moment`'s step kept in states/, in the train state's
        format, so that a run can be replayed from it (`fork_run`)."""
        folder = self.path / STATES
        if folder.is_symlink():
            raise RunFolderError(f"{folder} is a symbolic link; the run writes nothing through one. Remove it")
        folder.mkdir(exist_ok=True)
        path = folder / moment_file(moment.progress.step)
        save_tensors(path, *moment.tensors())
        return path

    def kept_moments(self) -> list[int]:
        """The steps whose whole training state this run keeps in states/."""
        folder = self.path / STATES
        if not folder.is_dir() or folder.is_symlink():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _MOMENT.fullmatch(p.name)))

    def resume_point(self, steps: int, eval_every: int | None = None) -> Checkpoint | None:
        """The checkpoint a resume continues from, its fields checked; None for a run that
        stopped before its first checkpoint (a config, no train state), which starts again from
        step 0 with a warning. RunFolderError when the folder holds no run, or its train state is
        damaged, beyond `steps` (the config's train.steps) or missing the metrics up to it (with
        `eval_every`, the config's: every evaluation's record up to the checkpoint's step)."""
        path = self.path / TRAIN_STATE
        if not path.exists():
            if not self.holds_run():
                raise RunFolderError(f"--resume: {self.path} holds no run ({CONFIG}); there is nothing to resume")
            warnings.warn(f"{path} does not exist (the run stopped before its first checkpoint); starting from step 0",
                          stacklevel=2)
            return None
        checkpoint = Checkpoint.read(path)  # every field present, the weights match their digest
        step = checkpoint.stamp.step
        if step > 0 and not self.metrics_file.exists():
            raise RunFolderError(f"--resume: {self.metrics_file} is missing while {path} is at step {step}: "
                                 f"the run's records up to there are lost. Restore the file, or train a new run")
        if step > steps:
            raise RunFolderError(f"{path}: meta.step={step} is beyond train.steps={steps} of {CONFIG}")
        if eval_every is not None:
            self._check_records_reach(step, steps, eval_every)
        return checkpoint

    def _check_records_reach(self, step: int, steps: int, eval_every: int) -> None:
        """RunFolderError unless metrics.jsonl reaches the last evaluation at or before the
        checkpoint's `step` (every `eval_every` steps, and the last step): a file cut short lost
        records that resuming cannot recompute, and a resumed run would report success without them."""
        expected = step if step == steps else step - step % eval_every
        recorded = [r["step"] for r in self.metrics() if r["step"] <= step and not r.get("diverged")]
        last = recorded[-1] if recorded else 0
        if last < expected:
            raise RunFolderError(f"--resume: {self.metrics_file} ends at step {last}, but the checkpoint "
                                 f"({TRAIN_STATE}) is at step {step}: the records of the evaluations after step {last} "
                                 f"are lost (the file was cut). Restore it, or train a new run")

    def restore_weights_file(self, checkpoint: Checkpoint) -> None:
        """The weights file must be the checkpoint's, by the hash of its tensors: one that is
        missing, damaged (flipped bytes under an intact header) or stale is rewritten from it."""
        try:
            verified_weights(self.path)
        except WeightsMismatch as err:
            warnings.warn(f"{err}; rewritten from {TRAIN_STATE}", stacklevel=2)
            runs.save_weights(self.path, checkpoint.weights, checkpoint.stamp)

    def remove_unstarted_run(self) -> None:
        """After a failure before the first checkpoint: the run files this run wrote, and the
        folder if nothing else is in it, so that it can be used again with other settings."""
        if not self.path.is_dir() or self.has_checkpoint():
            return
        for name in (CONFIG, METRICS, MIMIC, DEMO):
            (self.path / name).unlink(missing_ok=True)
        remove_snapshots(self.path)
        states = self.path / STATES
        for moment in self.kept_moments():
            (states / moment_file(moment)).unlink()
        with contextlib.suppress(OSError):
            states.rmdir()
        with contextlib.suppress(OSError):
            self.path.rmdir()


def fork_run(source: Path, step: int, out: RunFolder, cfg: RunConfig) -> None:
    """A new run in `out` that starts from the training state `source` kept at `step`, with `cfg`
    (the source's config, a setting changed or not): its config, the source's records and
    snapshots up to `step`, that state as its train state and weights, and init.json saying where
    it came from. Resuming it replays the source from `step` (bit for bit on the CPU when nothing
    changed), or the counterfactual of the setting changed."""
    kept = RunFolder(source).kept_moments()
    if step not in kept:
        raise RunFolderError(f"--from {source}@{step}: that run keeps no training state at step {step} (it keeps "
                             f"{kept or 'none'}; train.keep_state lists steps to keep; event snapshots keep theirs)")
    if step > cfg.train.steps:
        raise ConfigError(f"--from {source}@{step}: step {step} is beyond train.steps={cfg.train.steps}")
    state = source / STATES / moment_file(step)
    checkpoint = Checkpoint.read(state)
    checkpoint.check_digest()
    out.check_receives()
    out.start(cfg)
    records = [r for r in read_metrics(source) if r["step"] <= step and not r.get("diverged")]
    atomic_write_bytes(out.path / METRICS, "".join(json.dumps(r) + "\n" for r in records).encode())
    out.write_init({"from": str(source), "step": step, "weights_digest": checkpoint.stamp.digest, "replayed": True})
    copy_snapshots(source, out.path, step)
    shutil.copyfile(state, out.path / TRAIN_STATE)
    runs.save_weights(out.path, checkpoint.weights, checkpoint.stamp)
