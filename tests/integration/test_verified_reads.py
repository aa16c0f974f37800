"""Every reader verifies what it reads (issue 30): weights left stale by a kill between the
checkpoint's two writes, or damaged under an intact header, are repaired from the train state by
the commands that write (resume, sweep, curriculum) and refused by those that only read
(load_run, analyze, report); a lock file that is a link is never written through."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import models.runs
from analyses.cli import main
from analyses.studies.lego_pool import TINY_CURRICULUM
from models.curriculum import train_curriculum
from models.runs import (
    INIT,
    LOCK,
    TRAIN_STATE,
    WEIGHTS,
    WeightsMismatch,
    load_run,
    read_config,
    read_train_state,
    run_state,
    verified_weights,
    weights_digest,
)

SMALL = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=16",
         "--set", "train.batch_size=16", "--set", "train.eval_every=8", "--set", "train.eval_size=64",
         "--set", "train.warmup_steps=2", "--set", "train.checkpoint_every=8", "--no-progress"]


class Killed(BaseException):
    """A kill: not an Exception, so no handler on the way (a sweep's cell loop) records it."""


def die_before_the_last_weights(monkeypatch, step: int) -> None:
    """The process dies after writing the train state of `step` and before its weights file."""
    original = models.runs.save_tensors

    def dying_save(path, tensors, meta=None):
        if path.name == WEIGHTS and meta and meta.get("step") == str(step):
            raise Killed
        return original(path, tensors, meta)

    monkeypatch.setattr(models.runs, "save_tensors", dying_save)


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / WEIGHTS)), load_file(str(b / WEIGHTS))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def flip_a_tensor_byte(path: Path) -> None:
    """Damage the tensor data and leave the header (and the digest it records) intact."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def sweep_args(out: Path) -> list[str]:
    return ["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0", "--out", str(out), "--workers", "1", *SMALL]


def test_a_sweep_cell_killed_between_its_last_two_writes_is_repaired_not_counted_done(tmp_path, monkeypatch):
    assert main(sweep_args(tmp_path / "whole")) == 0
    with monkeypatch.context() as patch:
        die_before_the_last_weights(patch, step=16)
        with pytest.raises(Killed):
            main(sweep_args(tmp_path / "killed"))
    cell = tmp_path / "killed" / "seed=0"
    assert not same_weights(cell, tmp_path / "whole" / "seed=0")  # the stale weights of step 8
    with pytest.raises(WeightsMismatch, match="holds the weights of step 8.*step 16"):
        run_state(cell, read_config(cell), repair=False)
    with pytest.warns(UserWarning, match="stale; rewritten from"):
        assert main(sweep_args(tmp_path / "killed")) == 0
    assert same_weights(cell, tmp_path / "whole" / "seed=0")
    assert json.loads((tmp_path / "killed" / "sweep.json").read_text())["counts"] == {"done": 1}


def test_a_curriculum_stage_killed_between_its_last_two_writes_is_repaired_before_the_next_stage(tmp_path, monkeypatch):
    every = ["train.checkpoint_every=4"]  # so that the first stage has earlier weights to leave behind
    whole = train_curriculum(TINY_CURRICULUM, tmp_path / "whole", every, progress=False)
    first_steps = read_config(whole[0].folder).train.steps
    with monkeypatch.context() as patch:
        die_before_the_last_weights(patch, step=first_steps)
        with pytest.raises(Killed):
            train_curriculum(TINY_CURRICULUM, tmp_path / "killed", every, progress=False)
    with pytest.warns(UserWarning, match="stale; rewritten from"):
        killed = train_curriculum(TINY_CURRICULUM, tmp_path / "killed", every, progress=False)
    for ours, theirs in zip(killed, whole):
        assert same_weights(ours.folder, theirs.folder)
    started = json.loads((killed[1].folder / INIT).read_text())
    assert started["step"] == first_steps
    assert started["weights_digest"] == weights_digest(load_file(str(killed[0].folder / WEIGHTS)))


@pytest.fixture
def trained(tmp_path) -> Path:
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SMALL]) == 0
    return out


def test_flipped_weight_bytes_under_an_intact_header_are_refused_by_readers(trained, capsys):
    original = {k: v.clone() for k, v in load_file(str(trained / WEIGHTS)).items()}  # not views of the file's bytes
    flip_a_tensor_byte(trained / WEIGHTS)
    with pytest.raises(WeightsMismatch, match="does not hash|tensors do not hash|not those of the train state"):
        load_run(trained)
    damaged = (trained / WEIGHTS).read_bytes()
    assert main(["analyze", str(trained)]) == 2
    assert main(["report", str(trained)]) == 2
    assert "--resume" in capsys.readouterr().err  # the message says how to repair it
    assert (trained / WEIGHTS).read_bytes() == damaged  # readers leave the folder as they found it
    with pytest.warns(UserWarning, match="rewritten from"):
        assert main(["train", "--out", str(trained), "--resume", "--no-progress"]) == 0
    assert all(torch.equal(original[k], v) for k, v in load_file(str(trained / WEIGHTS)).items())
    assert load_run(trained).weights.digest == read_train_state(trained / TRAIN_STATE)[1]["digest"]


def test_flipped_weight_bytes_in_a_finished_sweep_cell_are_rewritten_from_its_train_state(tmp_path):
    out = tmp_path / "sweep"
    assert main(sweep_args(out)) == 0
    cell = out / "seed=0"
    kept = tmp_path / "kept"
    shutil.copytree(cell, kept)
    flip_a_tensor_byte(cell / WEIGHTS)
    with pytest.warns(UserWarning, match="damaged.*rewritten from"):
        assert main(sweep_args(out)) == 0
    assert same_weights(cell, kept)


def test_weights_without_a_train_state_are_checked_against_their_own_digest(trained):
    (trained / TRAIN_STATE).unlink()  # a zoo entry's folder: config, weights, metrics
    assert verified_weights(trained)[1].step == 16
    flip_a_tensor_byte(trained / WEIGHTS)
    with pytest.raises(Exception, match="tensors do not hash to the digest in its header"):
        load_run(trained)


def test_a_lock_file_that_is_a_link_is_never_written_through(tmp_path, capsys):
    foreign = tmp_path / "someone-elses.txt"
    foreign.write_text("not the workbench's\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(foreign)
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SMALL]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert foreign.read_text() == "not the workbench's\n"
    assert (out / LOCK).is_symlink()  # left for its owner to look at


def test_the_analysis_records_the_weights_it_read_and_the_report_says_when_they_changed(trained):
    from models.runs import ANALYSIS, REPORT

    assert main(["analyze", str(trained), "--samples", "32"]) == 0
    recorded = json.loads((trained / ANALYSIS).read_text())["weights"]
    assert recorded == load_run(trained).weights.to_dict() and recorded["step"] == 16
    assert "read the weights of step 16" in (trained / REPORT).read_text()
    stale = {**recorded, "step": 8, "digest": "0" * 64}
    written = json.loads((trained / ANALYSIS).read_text())
    (trained / ANALYSIS).write_text(json.dumps({**written, "weights": stale}))
    assert main(["report", str(trained)]) == 0
    assert "not the weights in this folder now (step 16)" in (trained / REPORT).read_text()


def test_a_second_sweep_on_a_folder_in_use_exits_2_and_changes_nothing(tmp_path, capsys):
    from models.runs import run_lock

    out = tmp_path / "sweep"
    with run_lock(out):  # what a running sweep holds, in this process's place (a lock of another pid)
        from tests.processes import start_cli

        proc = start_cli(*sweep_args(out), cwd=Path(__file__).resolve().parents[2])
        code, err = proc.wait(timeout=120), proc.stderr()
    assert code == 2, err
    assert "being written by another process" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == []  # nothing written beside the lock, which is gone again
