"""The hostile table's tools (tests/integration/test_hostile.py): how a row damages a file of a
run folder, makes a write fail (a read-only folder, a full disk), and snapshots what the user
owns, so that a row can check that nothing outside the command's folder changed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import stat
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError

import analyses.runners.sweep
import interp.analysis
import models.run_folder
import models.runs
import models.safe_files
from models.runs import CONFIG, METRICS, TRAIN_STATE, WeightsStamp, save_weights, verified_weights, weights_digest
from models.safe_files import size_limit

NOTES = b"the user's own notes, not a run file\na second line\n"  # what a planted symbolic link points to
DEAD_PID = 4_194_304  # above Linux's largest pid (pid_max <= 2**22): no process has it


# ------------------------------------------------------------------------------------------------
# damage


def _flip(path: Path, at: int, bit: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= bit
    path.write_bytes(bytes(data))


def _header(data: bytes) -> tuple[int, dict]:
    length = struct.unpack("<Q", data[:8])[0]
    return length, json.loads(data[8:8 + length])


def _flip_tensor(path: Path, pick) -> None:
    """Flip a byte in the middle of one tensor's data (the header left intact)."""
    data = path.read_bytes()
    length, header = _header(data)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    start, end = tensors[pick(tensors)]["data_offsets"]
    _flip(path, 8 + length + (start + end) // 2)


def _dup_key(path: Path, text: str) -> str:
    """The file with one key written twice, by hand."""
    if path.name == CONFIG:  # "steps" twice in the train section
        assert '"train": {' in text
        return text.replace('"train": {', '"train": {\n    "steps": 7,', 1)
    if path.name == METRICS:  # the first record's "step" twice
        return text.replace("{", '{"step": 99, ', 1)
    if path.name == "index.json":  # a snapshot index's "schema" twice
        return text.replace("{", '{\n "schema": 7,', 1)
    return text.replace("{", '{\n "task": "lego",', 1)


DEEP = '{"a": ' * 10_000 + "1" + "}" * 10_000


def _socket_at(path: Path) -> None:
    """A Unix socket file at `path` (bound from its folder: a socket's path is limited to 108 bytes)."""
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        server = socket.socket(socket.AF_UNIX)
        server.bind(path.name)
        server.close()
    finally:
        os.chdir(here)


def _nan_weights(path: Path) -> None:
    """Weights that are all NaN, with a header that verifies (a run that diverged without noticing);
    the train state, which would contradict them, removed."""
    run = path.parent
    (run / TRAIN_STATE).unlink()
    tensors, stamp = verified_weights(run)
    nan = {name: torch.full_like(t, float("nan")) for name, t in tensors.items()}
    save_weights(run, nan, WeightsStamp(stamp.step, weights_digest(nan)))


def _special_damage(path: Path, kind: str) -> bool:
    """Issue 43's damages, which need not read the file first; False for another kind."""
    if kind in ("fifo", "devzero", "socket", "huge"):
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        _socket_at(path)
    elif kind == "huge":  # sparse: one byte past what its kind may hold, on no disk space
        with open(path, "wb") as f:
            f.truncate(size_limit(path) + 1)
    elif kind == "temp-left":
        (path.parent / f".{path.name}.{DEAD_PID}.0badf00d.tmp").write_bytes(b"half a file")
    elif kind == "temp-only":
        path.write_bytes(b'{"task": {"na')
    elif kind == "nan":
        _nan_weights(path)
    else:
        return False
    return True


def damage(path: Path, kind: str, outside: Path) -> None:
    if _special_damage(path, kind):
        return
    if kind == "symlink-folder":  # the folder moved beside the user's files (or made there), a link to it in its place
        target = outside / f"{path.name}.other-run"
        if path.exists():
            path.rename(target)
        else:
            target.mkdir()
        path.symlink_to(target, target_is_directory=True)
        return
    data = path.read_bytes()
    if kind == "deleted":
        path.unlink()
    elif kind == "truncated":  # half of it; never right after a newline, which would leave whole lines only
        cut = len(data) // 2
        path.write_bytes(data[: cut + 1 if data[cut - 1 : cut] == b"\n" else cut])
    elif kind == "flip-data":  # a byte of the last tensor, near the end of the file
        _flip_tensor(path, lambda t: max(t, key=lambda k: t[k]["data_offsets"][1]))
    elif kind == "flip-weights":  # a byte of a model.* tensor of a train state
        _flip_tensor(path, lambda t: next(k for k in sorted(t) if k.startswith("model.")))
    elif kind == "flip-rng":
        _flip_tensor(path, lambda t: "rng.data")
    elif kind == "flip-header":  # '"dtype"' past the header's middle becomes '"etype"'
        length, _ = _header(data)
        _flip(path, data.index(b'"dtype"', 8 + length // 2) + 1)
    elif kind == "bitflip":  # JSON: its first byte, '{' -> 'z'
        _flip(path, 0)
    elif kind == "symlink":
        target = outside / f"{path.name}.mine"
        target.write_bytes(NOTES)
        path.unlink()
        path.symlink_to(target)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "dup-key":
        path.write_text(_dup_key(path, data.decode()))
    elif kind == "long-int":  # a number of 5,000 digits, past Python's 4,300 (config: train.steps; metrics: line 1)
        text = data.decode()
        field = '"steps": ' if path.name == CONFIG else '"step": '
        start = text.index(field) + len(field)
        end = start + len(re.match(r"[0-9]+", text[start:]).group())
        path.write_text(text[:start] + "1" * 5000 + text[end:])
    elif kind == "float-overflow":  # train.lr as an integer too large for a double
        path.write_text(re.sub(r'"lr": [^,\n]+', '"lr": 1' + "0" * 400, data.decode(), count=1))
    elif kind == "no-train-loss":  # records without the metric (a hand-edited or foreign file)
        records = [json.loads(line) for line in data.decode().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "train_loss"}) + "\n" for r in records))
    elif kind == "deep":
        if path.name == METRICS:  # the first line; a damaged last line alone would be dropped
            lines = data.decode().splitlines()
            path.write_text("\n".join([DEEP, *lines[1:]]) + "\n")
        else:
            path.write_text(DEEP)
    else:
        raise AssertionError(kind)


# ------------------------------------------------------------------------------------------------
# failing writes


def _inside(path, folder: Path) -> bool:
    return os.path.realpath(os.path.dirname(os.path.abspath(os.fspath(path)))) == os.path.realpath(folder)


def _safetensors_error(folder: Path, code: int) -> SafetensorError:
    """What safetensors raises when it cannot write (it writes a temporary file of its own beside
    the target, then renames it): measured with a 0o555 folder as an unprivileged user."""
    return SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} (os error {code}) at path "
                           f'"{folder}/.tmpQ1w2E3"')


@contextlib.contextmanager
def read_only(folder: Path, monkeypatch):
    """The folder made read-only: chmod 0o555, or where the tests run as root (whom the mode does
    not stop) what the kernel does to an unprivileged user in such a folder: creating, opening for
    writing, renaming or removing a name in it fails with EACCES naming the path, and safetensors
    fails with its own error."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        try:
            yield
        finally:
            os.chmod(folder, 0o755)
        return

    def denied(*paths):
        return OSError(errno.EACCES, os.strerror(errno.EACCES), *[os.fspath(p) for p in paths[:1]],
                       *([None, os.fspath(paths[1])] if len(paths) > 1 else []))

    real_open, real_unlink, real_replace, real_rename, real_mkdir = os.open, os.unlink, os.replace, os.rename, os.mkdir
    real_save = models.safe_files.save_file
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def open_(path, flags, *args, **kwargs):
        if flags & writing and _inside(path, folder):
            raise denied(path)
        return real_open(path, flags, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        if _inside(path, folder) and os.path.lexists(path):
            raise denied(path)
        return real_unlink(path, *args, **kwargs)

    def move(real):
        def moved(src, dst, *args, **kwargs):
            if _inside(src, folder) or _inside(dst, folder):
                raise denied(src, dst)
            return real(src, dst, *args, **kwargs)
        return moved

    def mkdir(path, *args, **kwargs):
        if _inside(path, folder) and not os.path.lexists(path):
            raise denied(path)
        return real_mkdir(path, *args, **kwargs)

    def save_file(tensors, filename, *args, **kwargs):
        if _inside(filename, folder):
            raise _safetensors_error(folder, errno.EACCES)
        return real_save(tensors, filename, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "open", open_)
        m.setattr(os, "unlink", unlink)
        m.setattr(os, "remove", unlink)
        m.setattr(os, "replace", move(real_replace))
        m.setattr(os, "rename", move(real_rename))
        m.setattr(os, "mkdir", mkdir)
        m.setattr(models.safe_files, "save_file", save_file)
        yield


# the trainer writes through models.run_folder (RunFolder) and models.runs (weights)
WRITERS = (models.runs, models.run_folder, interp.analysis, analyses.runners.sweep)


def fail_writes(monkeypatch, function: str, target: Path, code: int) -> None:
    """`function` (atomic_write_bytes, save_tensors or append_line), wherever it is imported, fails
    with OSError(code) naming `target` when it writes `target`."""
    for module in WRITERS:
        original = getattr(module, function, None)
        if original is None:
            continue

        def failing(path, *args, _original=original, **kwargs):
            if Path(path) == target:
                raise OSError(code, os.strerror(code), str(path))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(module, function, failing)


def fail_safetensors(monkeypatch, target: Path, code: int) -> None:
    """safetensors' own save_file fails (as on a full disk, or a read-only folder) writing `target`."""
    real = models.safe_files.save_file

    def save_file(tensors, filename, *args, **kwargs):
        name = Path(filename).name  # the temporary sibling models.safe_files writes through: .NAME.PID.HEX.tmp
        if name.startswith(f".{target.name}.") and name.endswith(".tmp") and Path(filename).parent == target.parent:
            raise _safetensors_error(target.parent, code)
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(models.safe_files, "save_file", save_file)


# ------------------------------------------------------------------------------------------------
# what the user owns


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, links not followed: ('link', target), ('dir',), ('file', sha256),
    a large (sparse) file by ('file', size, mtime), or a special file by its kind (never opened:
    a FIFO would block)."""
    seen: dict[str, tuple] = {}

    def walk(folder: str) -> None:
        for entry in os.scandir(folder):
            rel = os.path.relpath(entry.path, root)
            info = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                seen[rel] = ("link", os.readlink(entry.path))
            elif entry.is_dir():
                seen[rel] = ("dir",)
                walk(entry.path)
            elif not stat.S_ISREG(info.st_mode):
                seen[rel] = ("special", stat.S_IFMT(info.st_mode))
            elif info.st_size > 64 << 20:
                seen[rel] = ("file", info.st_size, info.st_mtime_ns)
            else:
                seen[rel] = ("file", hashlib.sha256(Path(entry.path).read_bytes()).hexdigest())

    if root.exists():
        walk(str(root))
    return seen


def under(snap: dict[str, tuple], prefix: str, inside: bool) -> dict[str, tuple]:
    return {k: v for k, v in snap.items() if (k == prefix or k.startswith(prefix + os.sep)) == inside}
