"""Snapshots: the weights of a run at chosen steps, so that what the model computed can be read at
any moment of training, not only at its end (a timeline: interp/timeline.py).

A run folder keeps them in `snapshots/`: one safetensors file per step (`step-0000100.safetensors`,
its tensors' sha256 and step in the header, written atomically like the weights) and
`snapshots/index.json`, the list of them with their digests and why each was kept. The final
weights are the run's own `model.safetensors` and are not stored twice.

Which steps (`train.snapshots`): a count N keeps step 0, N - 2 steps log-spaced between it and the
last step, and the final weights (N points in all); a list keeps exactly those steps. Events keep
more: when the training loss rises more than `train.snapshot_loss_factor` above its running
minimum, or a watched held-out rate (`train.snapshot_watch`) moves by more than
`train.snapshot_watch_delta` between two evaluations, the weights of the evaluation *before* are
kept, which the trainer holds in memory (`SnapshotKeeper`). Snapshots are stored in float16 (a
tensor whose values float16 cannot hold stays float32): half the disk, and a relative rounding of
5e-4 that no verdict or patching share we measure is sensitive to; readers return float32.

Resume drops the snapshots after the checkpoint it continues from (the resumed run keeps them
again), and a file the index does not list (a kill between a file and its index) is removed."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from models.runs import SNAPSHOTS, weights_digest
from models.safe_files import RunFolderError, atomic_write_bytes, read_checked, read_tensors, save_tensors

INDEX = "index.json"
SCHEMA = 1  # of index.json
MAX_EVENT_SNAPSHOTS = 16  # per run: a run whose loss keeps spiking does not fill the disk
LOSS_RISE_FLOOR = 0.01  # a loss "spike" must also rise this much in absolute terms (nats): 1e-7 -> 4e-7 is noise
FLOAT16_MAX = 65504.0
_FILE = re.compile(r"step-(\d{7,})\.safetensors")


def snapshot_file(step: int) -> str:
    return f"step-{step:07d}.safetensors"


def scheduled_steps(spec: int | list[int], steps: int) -> list[int]:
    """The steps `train.snapshots` keeps below the last one (the final weights are the run's own):
    for a count N, step 0 and N - 2 steps log-spaced over 1..steps (fewer where rounding makes
    two equal); for a list, its steps. [] for 0."""
    if isinstance(spec, list):
        return sorted({s for s in spec if s < steps})
    if spec == 0:
        return []
    inner = np.geomspace(1, steps, spec - 1)[:-1] if spec > 2 else np.array([])
    return sorted({0, *(int(round(s)) for s in inner)} - {steps})


@dataclass(frozen=True)
class SnapshotEntry:
    """One kept snapshot as index.json lists it."""

    step: int
    file: str
    digest: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "file": self.file, "digest": self.digest, "reasons": list(self.reasons)}


def _for_storage(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """float16 copies on the CPU, but float32 for a tensor float16 would overflow."""
    out = {}
    for name, tensor in weights.items():
        t = tensor.detach().float().cpu()
        fits = t.numel() == 0 or t.abs().max().item() < FLOAT16_MAX
        out[name] = t.half() if fits else t
    return out


def _digest(tensors: dict[str, Tensor]) -> str:
    return weights_digest(tensors)


def read_index(run_dir: str | Path) -> list[SnapshotEntry]:
    """The run's snapshots in step order ([] where it has none), checked: RunFolderError (exit 2)
    naming snapshots/index.json when it is not this workbench's index."""
    path = Path(run_dir) / SNAPSHOTS / INDEX
    data = read_checked(path, _index_problem)
    if data is None:
        return []
    parsed = [_entry(path, item) for item in data["snapshots"]]
    steps = [e.step for e in parsed]
    if steps != sorted(set(steps)):
        raise RunFolderError(f"{path} lists steps out of order or twice ({steps}); it is damaged")
    return parsed


def _index_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("snapshots"), list):
        return f"is not a snapshot index of schema {SCHEMA} (an object with a list 'snapshots')"
    return None


def _entry(path: Path, item: Any) -> SnapshotEntry:
    try:
        step, file, digest, reasons = item["step"], item["file"], item["digest"], item["reasons"]
        ok = (isinstance(step, int) and not isinstance(step, bool) and step >= 0 and file == snapshot_file(step)
              and isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest) is not None
              and isinstance(reasons, list) and all(isinstance(r, str) for r in reasons))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise RunFolderError(f"{path}: the entry {json.dumps(item)[:200]} is not a snapshot (step, file "
                             f"step-NNNNNNN.safetensors, a sha256 digest, reasons); the index is damaged")
    return SnapshotEntry(step, file, digest, tuple(reasons))


def read_snapshot(run_dir: str | Path, entry: SnapshotEntry) -> dict[str, Tensor]:
    """The snapshot's weights as float32, verified: its tensors must hash to the digest in its
    header and in the index, at the index's step. RunFolderError naming the file otherwise."""
    path = Path(run_dir) / SNAPSHOTS / entry.file
    tensors, meta = read_tensors(path)
    digest = _digest(tensors)
    if digest != meta.get("digest") or digest != entry.digest or meta.get("step") != str(entry.step):
        raise RunFolderError(f"{path} does not match its digest (in its header and in {SNAPSHOTS}/{INDEX}) or its "
                             f"step; the snapshot is damaged. Retrain the run to rebuild it, or remove the file and "
                             f"its index entry to do without it")
    return {name: t.float() for name, t in tensors.items()}


def write_index(run_dir: Path, entries: list[SnapshotEntry]) -> None:
    payload = {"schema": SCHEMA, "snapshots": [e.to_dict() for e in sorted(entries, key=lambda e: e.step)]}
    atomic_write_bytes(run_dir / SNAPSHOTS / INDEX, json.dumps(payload, indent=1).encode())


@dataclass
class EventWatch:
    """Decides, one evaluation record at a time, whether something happened that the weights
    before it should be kept for: the training loss rising more than `loss_factor` above its
    running minimum (and by LOSS_RISE_FLOOR at least; once per spike: not again until it has come
    back under), or a watched metric moving by more than `delta` since the previous evaluation."""

    loss_factor: float | None
    watch: list[str]
    delta: float
    running_min: float = math.inf
    spiking: bool = False
    last: dict[str, float] = field(default_factory=dict)

    def update(self, record: dict[str, Any]) -> list[str]:
        """The reasons this record is an event ([] where it is none), and the state moved on."""
        reasons = []
        loss = record.get("train_loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            risen = (self.loss_factor is not None and loss > self.loss_factor * self.running_min
                     and loss - self.running_min > LOSS_RISE_FLOOR)
            if risen and not self.spiking:
                reasons.append(f"loss spike: training loss {loss:.3g}, {loss / self.running_min:.3g}x its "
                               f"running minimum {self.running_min:.3g}")
            self.spiking = risen
            self.running_min = min(self.running_min, loss)
        for name in self.watch:
            value = record.get(name)
            if not isinstance(value, (int, float)):
                continue
            before = self.last.get(name)
            if before is not None and abs(value - before) > self.delta:
                reasons.append(f"{name} moved {before:.3f} -> {value:.3f}")
            self.last[name] = float(value)
        return reasons


class SnapshotKeeper:
    """The trainer's side: keeps the scheduled snapshots as training passes their steps, and the
    event snapshots from the weights it holds from the last evaluation."""

    def __init__(self, run_dir: Path, schedule: list[int], watch: EventWatch):
        self.dir, self.schedule, self.watch = Path(run_dir), set(schedule), watch
        self.held: tuple[int, dict[str, Tensor]] | None = None
        self.entries: list[SnapshotEntry] = []

    def start(self, weights: dict[str, Tensor]) -> None:
        """A run at step 0 with `weights`: a folder's earlier snapshots are removed, step 0's is
        kept where the schedule has it, and held for the first evaluation."""
        self.entries = []
        self._clear_files(keep=set())
        self._made()
        write_index(self.dir, [])
        self.after_step(0, weights)
        self.held = (0, _clone(weights))

    def resume(self, step: int, records: list[dict[str, Any]], weights: dict[str, Tensor]) -> None:
        """Continue at `step`: the snapshots after it are dropped (the run keeps them again), the
        event watch replays the records up to it, and the weights there are the ones held."""
        self.entries = [e for e in read_index(self.dir) if e.step <= step]
        self._clear_files(keep={e.file for e in self.entries})
        self._made()
        write_index(self.dir, self.entries)
        for record in records:
            if "train_loss" in record:
                self.watch.update(record)
        self.held = (step, _clone(weights))

    def due(self, step: int) -> bool:
        """Whether the schedule keeps this step."""
        return step in self.schedule

    def after_step(self, step: int, weights: dict[str, Tensor]) -> None:
        if step in self.schedule:
            self._keep(step, weights, "scheduled")

    def at_evaluation(self, step: int, record: dict[str, Any], weights: dict[str, Tensor]) -> list[str]:
        """Keep the held weights when this evaluation is an event; then hold this step's. The
        reasons go into the record (`snapshot_event`), so metrics.jsonl says what was kept."""
        reasons = self.watch.update(record)
        events = sum(1 for e in self.entries if any(r != "scheduled" for r in e.reasons))
        if reasons and self.held is not None and events < MAX_EVENT_SNAPSHOTS:
            held_step, held = self.held
            for reason in reasons:
                self._keep(held_step, held, f"before step {step}: {reason}")
        self.held = (step, _clone(weights))
        return reasons

    def _keep(self, step: int, weights: dict[str, Tensor], reason: str) -> None:
        known = next((e for e in self.entries if e.step == step), None)
        if known is None:
            stored = _for_storage(weights)
            digest = _digest(stored)
            save_tensors(self._made() / snapshot_file(step), stored, {"step": str(step), "digest": digest})
            self.entries.append(SnapshotEntry(step, snapshot_file(step), digest, (reason,)))
        elif reason not in known.reasons:
            self.entries[self.entries.index(known)] = SnapshotEntry(step, known.file, known.digest,
                                                                    (*known.reasons, reason))
        write_index(self.dir, self.entries)

    def _made(self) -> Path:
        """The snapshots folder, made if needed."""
        folder = self.dir / SNAPSHOTS
        folder.mkdir(exist_ok=True)
        return folder

    def _clear_files(self, keep: set[str]) -> None:
        _remove_snapshot_files(self.dir / SNAPSHOTS, keep)


def _remove_snapshot_files(folder: Path, keep: set[str]) -> bool:
    """Remove the snapshot files in `folder` not in `keep` (the project's own names only, never
    through a link); whether `folder` is a real folder."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    for path in folder.iterdir():
        if _FILE.fullmatch(path.name) and path.name not in keep:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return True


def remove_snapshots(run_dir: str | Path) -> None:
    """The run's snapshots: its files, its index and the folder, where the folder holds nothing
    else (a folder holding someone's other files is left)."""
    folder = Path(run_dir) / SNAPSHOTS
    if _remove_snapshot_files(folder, keep=set()):
        (folder / INDEX).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _clone(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.detach().clone() for name, t in weights.items()}


def snapshot_disk_bytes(run_dir: str | Path) -> int:
    """Bytes the run's snapshot files take."""
    folder = Path(run_dir) / SNAPSHOTS
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def copy_snapshots(source: Path, dest: Path, up_to: int) -> None:
    """The snapshots of the run in `source` up to step `up_to`, files and index, into the run
    folder `dest` (a run replayed from that step: its timeline starts with the source's path)."""
    entries = [e for e in read_index(source) if e.step <= up_to]
    if not entries:
        return
    (dest / SNAPSHOTS).mkdir(exist_ok=True)
    for entry in entries:
        shutil.copyfile(source / SNAPSHOTS / entry.file, dest / SNAPSHOTS / entry.file)
    write_index(dest, entries)
