"""A workbench command in a process of its own, for the tests that kill one, race two or hold a
lock against one: forked from multiprocessing's fork server, which imports torch and the workbench
once per test worker, instead of a fresh `python -m analyses.cli` that imports torch and
TransformerLens anew (seconds each time). The process is a real one: its own pid, locks and exit
status, killable with any signal. The command-line entry point itself is run as a fresh process
by tests/smoke/test_every_command.py."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyses.runners.sweep import WORKER_IMPORTS

# what the fork server imports before its first fork: a sweep's workers' imports and the command line. The
# server is shared with the sweeps' pools, so whichever starts it first sets what it holds (a child imports the rest)
PRELOAD = [*WORKER_IMPORTS, "analyses.cli"]


class Command:
    """A started process with the part of `subprocess.Popen` the tests use: `pid`, `poll`, `wait`,
    `send_signal`, `returncode` (negative: killed by that signal), and what it wrote to stdout and
    stderr (read once it has ended)."""

    def __init__(self, process: multiprocessing.Process, output: Path):
        self.process, self._output = process, output

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise TimeoutError(f"pid {self.pid} still running after {timeout} s")
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def stdout(self) -> str:
        return self._read(".stdout")

    def stderr(self) -> str:
        return self._read(".stderr")

    def _read(self, suffix: str) -> str:
        path = self._output.with_suffix(suffix)
        return path.read_text(errors="replace") if path.exists() else f"(the process wrote no {path.name})"


def start(target: Callable[..., int | None], *args: Any, cwd: Path | str = ".") -> Command:
    """Run `target(*args)` (a module-level function; its return value is the exit status) in a
    process forked from the fork server, with one torch thread, in `cwd`; its stdout and stderr
    go to files that `Command.stdout` and `Command.stderr` read."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    output = Path(tempfile.mkdtemp(prefix="command-")) / "output"
    process = context.Process(target=_child, args=(target, args, str(Path(cwd).resolve()), str(output)))
    process.start()
    return Command(process, output)


def start_cli(*args: str, cwd: Path | str = ".") -> Command:
    """`workbench ARGS` in a forked process (see `start`)."""
    return start(cli, *args, cwd=cwd)


def cli(*args: str) -> int:
    from analyses.cli import main

    return main(list(args))


def _child(target: Callable[..., int | None], args: tuple, cwd: str, output: str) -> None:
    import torch

    for fd, suffix in ((1, ".stdout"), (2, ".stderr")):
        os.dup2(os.open(output + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.chdir(cwd)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    sys.exit(target(*args))
