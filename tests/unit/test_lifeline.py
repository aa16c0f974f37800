"""A worker dies with the process it works for, however that one dies (analyses/runners/lifeline.py)."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyses.runners.lifeline import machine_key, watched_pid

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death watch is Linux's")

POOL_PARENT = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from analyses.runners.lifeline import die_with
pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver"), initializer=die_with,
                           initargs=(os.getpid(),))
print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 60)
time.sleep(60)
"""


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_a_pool_worker_dies_within_a_second_of_its_parents_sigkill():
    parent = subprocess.Popen([sys.executable, "-c", POOL_PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    gone = _gone_within(worker, 2.0)
    if not gone:
        subprocess.run(["kill", "-9", str(worker)])
    assert gone, "the worker outlived its parent"


def test_a_watch_inside_a_block_kills_the_process_when_the_watched_one_ends_and_not_after_the_block():
    sleeper = subprocess.Popen(["sleep", "60"])
    script = ("import sys, time\nfrom analyses.runners.lifeline import dying_with\n"
              "with dying_with(int(sys.argv[1])): pass\nprint('block left', flush=True)\n"
              "with dying_with(int(sys.argv[1])): print('inside', flush=True); time.sleep(30)\n")
    watcher = subprocess.Popen([sys.executable, "-c", script, str(sleeper.pid)], cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    assert watcher.stdout.readline() == "block left\n"  # a finished block stopped its watch
    assert watcher.stdout.readline() == "inside\n"
    sleeper.kill()
    sleeper.wait()
    try:
        assert watcher.wait(timeout=5) == -signal.SIGKILL
    finally:
        watcher.kill()


def test_only_a_parent_on_this_machine_is_watched():
    assert watched_pid((123, machine_key())) == 123
    assert watched_pid((123, "another-machine:1")) is None
