"""Resume after a crash at any point (issue 43, item 5): each file of a run folder cut at a few
byte offsets, then `workbench train --resume`. The command either finishes the run (exit 0, and
the folder is then a finished run by `run_state`, its weights verified) or refuses naming the
file (exit 2, nothing written); it never reports success while the run is still partial."""

from __future__ import annotations

import shutil
import warnings

import pytest

from analyses.cli import main
from models.runs import CONFIG, METRICS, RUN_FILES, TRAIN_STATE, WEIGHTS, read_config, read_metrics, run_state
from models.safe_files import is_own_temp
from tests.integration.test_hostile import base_run, partial_run, snapshot  # noqa: F401 (module fixtures, shared)

FILES = (CONFIG, METRICS, WEIGHTS, TRAIN_STATE)
CUTS = ("0", "1", "8", "half", "last-byte")  # where the file ends: at byte 0, 1, 8, half its size, all but its last


def _cut_at(size: int, cut: str) -> int:
    return {"0": 0, "1": 1, "8": 8, "half": size // 2, "last-byte": size - 1}[cut]


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("which", ["finished", "partial"])
def test_a_resume_after_a_cut_file_finishes_or_refuses(which, name, cut, tmp_path, request, capsys):
    run = tmp_path / "run"
    shutil.copytree(request.getfixturevalue("base_run" if which == "finished" else "partial_run"), run)
    path = run / name
    data = path.read_bytes()
    path.write_bytes(data[:_cut_at(len(data), cut)])
    before = snapshot(tmp_path)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["train", "--out", str(run), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        assert snapshot(tmp_path) == before, "a refused resume changed the folder"
        return
    cfg = read_config(run)
    assert run_state(run, cfg, repair=False) == "done", f"exit 0 while the run is not finished: {err}"
    assert read_metrics(run)[-1]["step"] == cfg.train.steps
    assert all(p.name in RUN_FILES and not is_own_temp(p.name) for p in run.iterdir())

