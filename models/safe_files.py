"""Files and folders written and read without surprises, whatever they hold: one writer per
folder (a lock file, `run_lock`); every write goes to a fresh temporary sibling and is renamed
into place (a reader sees the old file or the new one, never half of one); nothing is written
through a symbolic link, and a failed write names its file. JSON is read strictly; tensors are
safetensors (no pickle). The run folder (models/runs.py) is built on these, and so are the files
and folders of analyses, sweeps and studies."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor

from tasks import ConfigError


class RunFolderError(ConfigError):
    """A run folder's file is unreadable or inconsistent, or another process writes the folder.
    The message names the file and what is wrong; the CLI exits 2. Raised by the readers and the
    lock here; the rest of the workbench imports it from models/runs.py."""


class FolderBusy(RunFolderError):
    """Another live process holds the folder's lock. Unlike the other RunFolderErrors, waiting
    fixes it: the holder finishes, or is stopped, and a re-run then takes the folder."""


LOCK = ".workbench.lock"  # present while a process writes the folder (holds its pid)
_HELD: dict[Path, tuple[int, int]] = {}  # folder -> (lock fd, re-entry count), this process's locks


@contextlib.contextmanager
def run_lock(run_dir: str | Path, wait: float = 0.0) -> Iterator[None]:
    """Hold the folder's write lock: one writer per run folder. Taken before anything is written
    (the folder is created if needed) and released on exit, however the block ends. A second
    writer gets RunFolderError naming the holder's pid. A lock left by a killed process is free
    again (the kernel drops flock locks with their process), so it is taken over. Re-entrant
    within one process. `wait`: seconds to keep trying while another process holds it (a worker
    of a killed sweep takes a moment to die) before FolderBusy. POSIX only (fcntl.flock)."""
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
    fd = _acquire_within(run_dir / LOCK, wait)
    _HELD[run_dir] = (fd, 1)
    try:
        yield
    finally:
        del _HELD[run_dir]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir / LOCK)  # unlinked while still locked: a waiting opener retries on the new file
        os.close(fd)


def locked_here(run_dir: str | Path) -> bool:
    """Whether this process holds the folder's lock (`run_lock`)."""
    return Path(run_dir).resolve() in _HELD


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


def _acquire_within(path: Path, wait: float) -> int:
    """`_acquire`, tried again every 0.1 s for up to `wait` seconds while the folder is busy."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return _acquire(path)
        except FolderBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


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
            raise FolderBusy(f"{path.parent} is being written by another process (pid {holder}); wait for it "
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

