"""Files and folders written and read without surprises, whatever they hold: one writer per
folder (a lock file, `run_lock`); every write goes to a fresh temporary sibling and is renamed
into place (a reader sees the old file or the new one, never half of one); nothing is written
through a symbolic link, and a failed write names its file. Every read goes through `open_regular`:
only a regular file (not a FIFO, device, socket or folder, nor a link to one), opened without
blocking, and never more bytes than its kind of file can sensibly hold (`size_limit`). JSON is read
strictly; tensors are safetensors (no pickle). A killed writer's temporary file
(`.NAME.PID.HEX.tmp`) is recognised as the project's own (`is_own_temp`) and removed by the next
holder of the folder's lock. The run folder (models/runs.py) is built on these, and so are the files
and folders of analyses, sweeps and studies."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from safetensors import safe_open
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
    of a killed sweep takes a moment to die) before FolderBusy. POSIX only (fcntl.flock). Its
    taker removes what killed writers left in the folder (`remove_dead_temps`)."""
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
    remove_dead_temps(run_dir)
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
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device is no writer's lock (`run_lock` refuses it)
        os.close(fd)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # closing drops the shared lock if we got it
    return None


def _holder(fd: int) -> str:
    """The pid a lock file names (written by its holder in `_acquire`), where that process is
    alive; else "unknown", with the pid the file names: another program holds the lock and the
    file still names a writer that has gone."""
    text = os.read(fd, 64).decode(errors="replace").strip()
    if not text.isdigit():
        return "unknown"
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return f"unknown; the lock file names pid {text}, which is not running"
    except (PermissionError, OverflowError, ValueError):  # alive under another user; or no pid at all
        pass
    return text


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
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except FileNotFoundError:  # the empty folder was removed under us (another writer's --out check): again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RunFolderError(f"{path} is a symbolic link; the workbench never writes through one (it would "
                                     f"write its pid into whatever the link points to). Remove the link, then try "
                                     f"again") from None
            _refuse_special_lock(path, _kind_by_name(path))  # a socket cannot be opened (ENXIO)
            raise
        kind = file_kind(os.fstat(fd).st_mode)
        if kind != "a regular file":
            os.close(fd)
            _refuse_special_lock(path, kind)
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


def _refuse_special_lock(path: Path, kind: str) -> None:
    if kind != "a regular file":
        raise RunFolderError(f"{path} is {kind}, not the workbench's lock file (a regular file); remove it, then "
                             f"try again")


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)  # "could not write"


_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[0-9a-f]{8}\.tmp")  # `_fresh_temp`'s names


def is_own_temp(name: str) -> bool:
    """Whether a file name is one of this project's temporary files (`.NAME.PID.HEX.tmp`, made by
    `_fresh_temp`): a write in progress, or what a killed writer left. Checks of what a folder
    holds ignore them."""
    return _TEMP.fullmatch(name) is not None


def remove_dead_temps(folder: Path) -> list[str]:
    """Remove the temporary files (`is_own_temp`) in `folder` whose writer's pid is not running on
    this machine: what a kill left behind. Called by the holder of the folder's lock, so no live
    writer of this folder owns them; a temp file of a live pid is left alone. Returns the names
    removed; a file that cannot be removed (a read-only folder) is left, and ignored."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            match = _TEMP.fullmatch(entry.name)
            if match and not _alive(int(match["pid"])):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(entry.name)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's live process
        return True
    except (ProcessLookupError, OverflowError):  # none, or a pid too large to exist
        return False
    return True


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
            raise RunFolderError(f"{path} is a symbolic link; the workbench never writes through one. "
                                 "Remove it") from None
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


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# The most bytes a reader takes from each kind of file: what it can sensibly hold, many times over
# (a config is a few KB, a tiny run's weights a few MB; the paper-scale models' weights are under
# 1 GB). Larger is damage or not the workbench's file, refused before it is read.
SIZE_LIMITS = {"config.json": 1 * MiB, "metrics.jsonl": 256 * MiB, "model.safetensors": 4 * GiB,
               "train_state.safetensors": 16 * GiB, LOCK: 64, "analysis.json": 256 * MiB}
JSON_LIMIT = 64 * MiB  # any other JSON file: --config, --prompts, sweep.json, cells.json, results.json ...
TENSORS_LIMIT = 4 * GiB  # any other safetensors file (snapshots ...)


def size_limit(path: Path) -> int:
    """The most bytes a reader takes from `path`, by its name (SIZE_LIMITS), else by its kind."""
    name = Path(path).name
    return SIZE_LIMITS.get(name, TENSORS_LIMIT if name.endswith(".safetensors") else JSON_LIMIT)


def file_kind(mode: int) -> str:
    """What an st_mode is, in words: "a regular file", "a FIFO (named pipe)", "a folder" ..."""
    kinds = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


@contextlib.contextmanager
def open_regular(path: Path, limit: int | None = None) -> Iterator[tuple[int, int]]:
    """An open read-only descriptor of `path` and the file's size, once checked: a regular file
    (a link is followed, and the file it reaches is what is checked: a link to /dev/zero is a
    device) of at most `limit` bytes (default `size_limit(path)`). Opened with O_NONBLOCK, so a
    FIFO cannot block the open. RunFolderError naming the file otherwise; FileNotFoundError
    passes through. The one way every reader of a run folder or input file opens it."""
    limit = size_limit(path) if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:  # a socket (ENXIO), a name too long, no permission ...
        kind = _kind_by_name(path)
        raise RunFolderError(f"{path} is {kind}, not a regular file; the workbench reads only regular files"
                             if kind != "a regular file" else f"{path} is unreadable ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        kind = file_kind(info.st_mode)
        if kind != "a regular file":
            raise RunFolderError(f"{path} is {kind}, not a regular file; the workbench reads only regular files. "
                                 f"Replace it with the file it should be")
        if info.st_size > limit:
            raise RunFolderError(f"{path} holds {info.st_size:,} bytes, more than a {Path(path).name} can sensibly "
                                 f"hold ({limit:,}); it is damaged or not the workbench's")
        yield fd, info.st_size
    finally:
        os.close(fd)


def _kind_by_name(path: Path) -> str:
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return "a regular file"  # unknown: the caller names the error instead


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of `path`, read through `open_regular` and never more than its limit (a file
    that grows past it while read is refused too)."""
    limit = size_limit(path) if limit is None else limit
    with open_regular(path, limit) as (fd, _):
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - total, 1 << 24))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise RunFolderError(f"{path} grew past {limit:,} bytes while it was read; it is not a finished file "
                                     f"of the workbench's")


def read_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; RunFolderError when it is damaged or not a
    regular file of sensible size (`open_regular`). safetensors reads by name (mmap), so on Linux
    it is given /proc/self/fd/N, the very file checked (no swap between check and read);
    elsewhere the name itself, right after the check."""
    try:
        with open_regular(path) as (fd, _):
            name = f"/proc/self/fd/{fd}" if os.path.exists(f"/proc/self/fd/{fd}") else str(path)
            with safe_open(name, "pt") as f:
                meta = f.metadata() or {}
                return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (a safetensors handle, not a dict)
    except FileNotFoundError:
        raise RunFolderError(f"{path} does not exist") from None
    except RunFolderError:
        raise
    except Exception as err:  # safetensors raises its own SafetensorError and OSError variants
        raise RunFolderError(f"{path} is damaged ({type(err).__name__}: {err})") from None


MAX_JSON_DEPTH = 64  # nesting no file of the workbench comes near; deeper is damage, not data


def read_json(path: Path, text: str | None = None, limit: int | None = None) -> Any:
    """A JSON file of the run folder or an input file, read strictly: RunFolderError naming the
    file when it is not a regular file of sensible size (`read_regular`, `limit`), unreadable or
    not JSON, when an object repeats a key (`"steps"` twice: which one was meant?), when it nests
    deeper than MAX_JSON_DEPTH, or when a number in it is too long to be a value (Python's limit
    of 4,300 digits). `text`: its content, already read."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise RunFolderError(f"{path} repeats the key {key!r} in one object; which value is meant is "
                                     f"ambiguous, so it is refused. Keep one {key!r}")
            seen[key] = value
        return seen

    try:
        text = read_regular(path, limit).decode() if text is None else text
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
    except ValueError as err:  # a number of more than 4,300 digits
        raise RunFolderError(f"{path} holds a number too long to be a value ({str(err).split(';')[0]})") from None


def present(path: Path) -> bool:
    """Whether anything is at `path`, a dangling symbolic link included: a reader then refuses it,
    naming it, where a missing file would be taken for one never written."""
    return path.exists() or path.is_symlink()


def read_checked(path: Path, problem: Callable[[Any], str | None] | None = None, again: str = "") -> Any:
    """The boundary between a JSON file the workbench wrote (a run's, a snapshot index, a sweep's)
    and the code that reads it: None where nothing is at `path` (`present`); else its strict JSON
    (`read_json`), once `problem` (what keeps the data from being the file its reader expects, in
    words after the path, or None) finds nothing wrong. RunFolderError names the file and what is
    wrong, then `again`: how to write the file anew."""
    if not present(path):
        return None
    tail = f"; {again}" if again else ""
    try:
        data = read_json(path)
    except RunFolderError as err:
        raise RunFolderError(f"{err}{tail}") from None
    except FileNotFoundError:  # present, so a link to nothing (or removed meanwhile)
        raise RunFolderError(f"{path} is a symbolic link to a file that does not exist{tail}") from None
    wrong = problem(data) if problem is not None else None
    if wrong:
        raise RunFolderError(f"{path} {wrong}{tail}")
    return data


Place = list[str | int]  # where a value sits in a JSON document: its keys and list indices


def finite_json(value: Any, where: Place | None = None) -> tuple[Any, list[Place]]:
    """`value` with every NaN or infinite float replaced by None, and the places replaced
    (`["heads", "scores", 0, 1]`), so that it can be written as strict JSON (json.dumps(...,
    allow_nan=False): a browser's JSON.parse rejects NaN). `nan_at` puts NaN back."""
    where = where or []
    if isinstance(value, float) and not math.isfinite(value):
        return None, [where]
    places: list[Place] = []
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[key], found = finite_json(item, [*where, key])
            places += found
        return out, places
    if isinstance(value, list | tuple):
        items = [finite_json(item, [*where, i]) for i, item in enumerate(value)]
        return [item for item, _ in items], [place for _, found in items for place in found]
    return value, places


def nan_at(value: Any, places: Any) -> Any:
    """`value` (as read back) with NaN at each of `places` that holds null (what `finite_json`
    wrote there), so that readers see the numbers the writer had; a place that is malformed or
    holds something else is left alone."""
    if not isinstance(places, list):
        return value
    for place in places:
        if not isinstance(place, list) or not place:
            continue
        holder = value
        for step in place[:-1]:
            holder = _step(holder, step)
        if _step(holder, place[-1], missing=False) is None:  # there, and null
            holder[place[-1]] = math.nan
    return value


def _step(holder: Any, key: Any, missing: Any = None) -> Any:
    """holder[key] where that is a dict key or a list index, else `missing`."""
    if isinstance(holder, dict) and isinstance(key, str) and key in holder:
        return holder[key]
    if isinstance(holder, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(holder):
        return holder[key]
    return missing


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
