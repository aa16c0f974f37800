"""A workbench command in a process of its own, for the tests that kill one, race two or hold a
lock against one: forked from multiprocessing's fork server, which imports torch and the workbench
once per test worker, instead of a fresh `python -m analyses.cli` that imports torch and
TransformerLens anew (seconds each time). The process is a real one: its own pid, locks and exit
status, killable with any signal. The command-line entry point itself is run as a fresh process
by tests/smoke/test_every_command.py."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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


def start(target: Callable[..., int | None], *args: Any, cwd: Path | str = ".", env: dict[str, str] | None = None,
          streams: tuple[str, str] | None = None) -> Command:
    """Run `target(*args)` (a module-level function; its return value is the exit status) in a
    process forked from the fork server, with one torch thread, in `cwd` (and with the environment
    `env`, when given); its stdout and stderr go to files that `Command.stdout` and `Command.stderr`
    read, or are appended to the two paths `streams` (`/proc/PID/fd/1`: another process's own)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    output = Path(tempfile.mkdtemp(prefix="command-")) / "output"
    process = context.Process(target=_child, args=(target, args, str(Path(cwd).resolve()), str(output), env, streams))
    process.start()
    return Command(process, output)


def start_cli(*args: str, cwd: Path | str = ".") -> Command:
    """`workbench ARGS` in a forked process (see `start`)."""
    return start(cli, *args, cwd=cwd)


def cli(*args: str) -> int:
    from analyses.cli import main

    return main(list(args))


def _child(target: Callable[..., int | None], args: tuple, cwd: str, output: str, env: dict[str, str] | None,
           streams: tuple[str, str] | None) -> None:
    import torch

    paths = streams or (output + ".stdout", output + ".stderr")
    flags = os.O_WRONLY | os.O_APPEND if streams else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, path in zip((1, 2), paths, strict=True):
        os.dup2(os.open(path, flags), fd)
    os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    sys.exit(target(*args))


STAND_IN = """#!{real} -SE
# `python -m analyses.cli ARGS`, run by the tests' fork server (tests/processes.py, forked_python); anything
# else is handed to the real interpreter
import json, os, signal, socket, sys
REAL, SOCKET = {real!r}, {socket!r}
if sys.argv[1:3] != ["-m", "analyses.cli"]:
    os.execv(REAL, [REAL, *sys.argv[1:]])
with socket.socket(socket.AF_UNIX) as server:
    server.connect(SOCKET)
    me = os.getpid()
    server.sendall(json.dumps({{"args": sys.argv[3:], "cwd": os.getcwd(), "env": dict(os.environ),
                               "streams": [f"/proc/{{me}}/fd/1", f"/proc/{{me}}/fd/2"]}}).encode() + b"\\n")
    replies = server.makefile()
    child = int(json.loads(replies.readline())["pid"])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: os.kill(child, signum))
    code = int(json.loads(replies.readline())["code"])
sys.exit(code if code >= 0 else 128 - code)
"""


@contextlib.contextmanager
def forked_python(folder: Path) -> Iterator[Path]:
    """An executable `folder/python` to give a shell script as its interpreter (the scripts' PYTHON):
    `python -m analyses.cli ARGS` runs `workbench ARGS` forked from the fork server (see `start`),
    in the caller's directory and environment, writing to the caller's own stdout and stderr, its
    exit status the caller's, and a SIGTERM, SIGINT or SIGHUP to the caller passed on; anything else
    (`python -c ...`) execs this interpreter. A fresh interpreter would import torch and
    TransformerLens for every command (10-15 s each). Linux only (the child opens /proc/PID/fd/N)."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("forked_python needs /proc (Linux)")
    sock = Path(tempfile.mkdtemp(prefix="fp-")) / "s"  # a short path: a socket's name is at most 107 bytes
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen()

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rw") as stream:
            request = json.loads(stream.readline())
            command = start(cli, *request["args"], cwd=request["cwd"], env=request["env"],
                            streams=tuple(request["streams"]))
            stream.write(json.dumps({"pid": command.pid}) + "\n")
            stream.flush()
            stream.write(json.dumps({"code": command.wait()}) + "\n")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the block has ended
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    python = folder / "python"
    python.write_text(STAND_IN.format(real=sys.executable, socket=str(sock)))
    python.chmod(0o755)
    try:
        yield python
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
