"""Worker processes that die with the process they work for, however it dies (SIGKILL, a closed
terminal, the kernel's out-of-memory killer, a CI time-out): an orphaned worker would train on
unwatched, holding its cell's lock, so that a re-run of the sweep could not take the cell.

Two mechanisms, on Linux:
- the parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`): the kernel kills the worker when
  the thread that forked it ends. It covers workers forked by the sweep itself (the `spawn` start
  method); a `forkserver` worker's parent is the fork server, which stays alive as long as its
  workers do (they hold its liveness pipe), so for those it is not enough alone;
- a watch on the sweep's own pid: a daemon thread waits on a pidfd (Linux >= 5.3; a poll of the
  pid every `POLL_S` elsewhere) and kills the worker the moment the sweep is gone.

Elsewhere than Linux only the poll applies. A worker stopped this way leaves its cell partial:
the next run resumes it from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 1.0  # how often the fallback watch looks for the parent, in seconds


def die_with(parent_pid: int) -> None:
    """Make this process die (SIGKILL) when `parent_pid` ends; for the rest of its life. Used as a
    process pool's initializer."""
    _set_parent_death_signal()
    if not _alive(parent_pid):
        _die()
    threading.Thread(target=_watch, args=(parent_pid, None), name="lifeline", daemon=True).start()


@contextlib.contextmanager
def dying_with(parent_pid: int | None) -> Iterator[None]:
    """Inside, this process dies when `parent_pid` ends (None: no watch); outside, the watch is
    gone again. For a worker that outlives one task (a Ray worker serves many)."""
    if parent_pid is None:
        yield
        return
    if not _alive(parent_pid):
        _die()
    stop_r, stop_w = os.pipe()
    watcher = threading.Thread(target=_watch, args=(parent_pid, stop_r), name="lifeline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        os.write(stop_w, b"x")
        watcher.join()
        os.close(stop_r)
        os.close(stop_w)


def machine_key() -> str:
    """What identifies this machine and pid namespace (boot id, pid namespace inode): two
    processes with the same key see the same pids, so one may watch the other's pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"{socket.gethostname()}:no-procfs"


def watched_pid(parent: tuple[int, str]) -> int | None:
    """The pid to die with, of a parent given as (pid, machine_key()): None when the parent runs
    on another machine (a Ray cluster's own job clean-up then stops the worker)."""
    pid, key = parent
    return pid if key == machine_key() else None


def _set_parent_death_signal() -> None:
    """SIGKILL from the kernel when the thread that forked this process ends (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _watch(parent_pid: int, stop_fd: int | None) -> None:
    """Wait until `parent_pid` ends (then die) or `stop_fd` becomes readable (then return)."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        _die()
    except (AttributeError, OSError):  # no pidfd here (an old kernel, not Linux): poll
        pidfd = None
    watched = [fd for fd in (pidfd, stop_fd) if fd is not None]
    while True:
        ready, _, _ = select.select(watched, [], [], None if pidfd is not None else POLL_S)
        if stop_fd in ready:
            if pidfd is not None:
                os.close(pidfd)
            return
        if pidfd in ready or (pidfd is None and not _alive(parent_pid)):
            _die()


def _alive(pid: int) -> bool:
    """Whether a process of that pid exists (a zombie counts as alive; a pidfd sees it end)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _die() -> None:
    """End this process at once: its parent is gone, nobody will read what it computes."""
    os.kill(os.getpid(), signal.SIGKILL)
