"""Readers open regular files only, and read a bounded number of bytes (issue 43, item 3); a
killed writer's temporary files are recognised and removed (item 5)."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

from models.safe_files import (
    LOCK,
    RunFolderError,
    finite_json,
    is_own_temp,
    nan_at,
    read_checked,
    read_json,
    read_regular,
    read_tensors,
    remove_dead_temps,
    run_lock,
    save_tensors,
    writer_pid,
)
from tests.helpers import no_hang


def _special(path, kind: str) -> None:
    """Make `path` a FIFO, a link to /dev/zero, or a listening Unix socket."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays


SPECIAL = {"fifo": "a FIFO", "devzero": "a character device", "socket": "a socket"}


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "model.safetensors", "prompts.json"])
def test_a_special_file_is_refused_at_once_naming_it_and_its_kind(tmp_path, name, kind):
    path = tmp_path / name
    _special(path, kind)
    with no_hang(10), pytest.raises(RunFolderError) as err:
        read_tensors(path) if name.endswith(".safetensors") else read_json(path)
    assert str(path) in str(err.value) and SPECIAL[kind] in str(err.value)


def test_a_file_larger_than_its_kind_can_hold_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as f:
        f.truncate(1 << 34)  # 16 GiB, sparse: reading it would take minutes and all memory
    with no_hang(10), pytest.raises(RunFolderError, match="more than a config.json can sensibly hold"):
        read_json(path)


def test_a_limit_is_enforced_on_what_is_read(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"[" + b"1," * 100 + b"1]")
    assert read_regular(path, limit=1000) == path.read_bytes()
    with pytest.raises(RunFolderError, match="more than a x.json"):
        read_regular(path, limit=100)


def test_a_link_to_a_regular_file_is_read(tmp_path):
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_json(tmp_path / "link.json") == {"a": 1}


def test_a_number_too_long_to_parse_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"steps": ' + "1" * 5000 + "}")
    with pytest.raises(RunFolderError, match="config.json holds a number too long"):
        read_json(path)


def test_tensors_are_read_from_the_checked_file(tmp_path):
    path = tmp_path / "w.safetensors"
    save_tensors(path, {"a": torch.arange(6.0).reshape(2, 3)}, {"step": "3"})
    tensors, meta = read_tensors(path)
    assert torch.equal(tensors["a"], torch.arange(6.0).reshape(2, 3)) and meta == {"step": "3"}
    tensors["a"].add_(1)  # the tensors are the reader's own, writable


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_special_lock_file_is_refused_and_never_blocks(tmp_path, kind):
    _special(tmp_path / LOCK, kind)
    with no_hang(10):
        assert writer_pid(tmp_path) is None
        with pytest.raises(RunFolderError, match=re.escape(f"{LOCK} is {SPECIAL[kind]}")), run_lock(tmp_path):
            pass


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_lock_taker_removes_a_dead_writers_temp_files_only(tmp_path):
    dead = tmp_path / f".model.safetensors.{_dead_pid()}.0badf00d.tmp"
    live = tmp_path / f".config.json.{os.getpid()}.0badf00d.tmp"
    foreign = tmp_path / ".notes.123.tmp"  # not a name the workbench makes
    for path in (dead, live, foreign):
        path.write_bytes(b"x")
    assert is_own_temp(dead.name) and is_own_temp(live.name) and not is_own_temp(foreign.name)
    with run_lock(tmp_path):
        assert not dead.exists() and live.exists() and foreign.exists()
    assert remove_dead_temps(tmp_path) == []


def test_finite_json_replaces_nan_and_infinity_by_null_and_says_where():
    value, where = finite_json({"a": [1.0, float("nan")], "b": {"c": float("inf")}, "d": "nan", "e": None})
    assert value == {"a": [1.0, None], "b": {"c": None}, "d": "nan", "e": None}
    assert where == [["a", 1], ["b", "c"]]
    back = nan_at(json.loads(json.dumps(value, allow_nan=False)), where + [["e", 0], ["zz"], "bad"])
    assert math.isnan(back["a"][1]) and math.isnan(back["b"]["c"]) and back["e"] is None and back["a"][0] == 1.0


def test_a_lock_held_by_another_program_does_not_name_a_dead_writer_as_its_holder(tmp_path):
    """Another program holds the folder's lock file, which still names a writer that has gone:
    the refusal says the holder is unknown and that the named pid is not running."""
    dead = _dead_pid()
    (tmp_path / LOCK).write_text(f"{dead}\n")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
                               "time.sleep(30)", str(tmp_path / LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        busy = rf"pid unknown; the lock file names pid {dead}, which is not running"
        with pytest.raises(RunFolderError, match=busy), run_lock(tmp_path):
            pass
        assert writer_pid(tmp_path).startswith("unknown")
    finally:
        holder.kill()
        holder.wait()


def test_read_checked_is_none_where_nothing_is_and_names_the_file_what_is_wrong_and_how_to_write_it_anew(tmp_path):
    path = tmp_path / "index.json"
    assert read_checked(path) is None
    path.symlink_to(tmp_path / "gone.json")  # a dangling link is something: refused, not taken for no file
    with pytest.raises(RunFolderError, match=r"index\.json.*; run it again$"):
        read_checked(path, again="run it again")
    path.unlink()
    path.write_text('{"schema": 2}')
    def problem(data):
        return None if data.get("schema") == 1 else f"is schema {data['schema']}"
    with pytest.raises(RunFolderError, match=rf"^{path} is schema 2; run it again$"):
        read_checked(path, problem, "run it again")
    path.write_text('{"schema": 1}')
    assert read_checked(path, problem, "run it again") == {"schema": 1}

