"""Where the traceback of an unexpected error (exit 1) goes (issue 43, item 4): into the --out
folder of a command that writes one, else into the temporary folder; never into a folder the
command was given to read, and the handler itself never fails."""

from __future__ import annotations

import tempfile

import pytest

import models.runs
import models.train
from analyses.cli import main
from models.runs import ERROR_LOG


class _Bug(RuntimeError):
    pass


def _broken(*args, **kwargs):
    raise _Bug("a bug of the workbench's own")


def _a_run_folder(tmp_path):
    """A folder that `workbench report` takes for a run (loading it is what the tests break)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "notes.txt").write_text("the user's")
    return run


@pytest.fixture
def temp_folder(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_reading_command_logs_in_the_temporary_folder_not_in_the_run(tmp_path, temp_folder, monkeypatch, capsys):
    run = _a_run_folder(tmp_path)
    monkeypatch.setattr(models.runs, "load_run", _broken)
    assert main(["report", str(run)]) == 1
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "notes.txt"]
    logs = list(temp_folder.glob("workbench-error-*.log"))
    assert len(logs) == 1 and "a bug of the workbench's own" in logs[0].read_text()
    assert str(logs[0]) in capsys.readouterr().err


def test_a_writing_command_logs_in_its_out_folder(tmp_path, temp_folder, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(models.train.Trainer, "fit", _broken)
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), "--no-progress"]) == 1
    assert "a bug of the workbench's own" in (out / ERROR_LOG).read_text()
    assert str(out / ERROR_LOG) in capsys.readouterr().err
    assert not list(temp_folder.iterdir())


def test_the_handler_never_fails_when_the_log_cannot_be_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))
    monkeypatch.setattr(models.runs, "load_run", _broken)
    assert main(["report", str(_a_run_folder(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "could not be saved" in err
