"""Snapshots through training and the solution timeline (issue 40): what a run keeps, that resume,
sweeps and curricula keep it too, `workbench analyze --timeline` on any task, and the bad inputs
it refuses with exit 2 and nothing written."""

import json
import os

import pytest
from safetensors import safe_open

from analyses.cli import main
from analyses.runners.sweep import run_cells
from analyses.studies.lego_pool import TINY_CURRICULUM
from models.curriculum import train_curriculum
from models.runs import ERROR_LOG, REPORT, SNAPSHOTS, TIMELINE, load_run, verified_weights
from models.snapshots import INDEX, read_index, read_snapshot, scheduled_steps
from models.train import Trainer
from tests.helpers import kill_then_resume, lego_timeline_run, tiny_composite_run

TINY = ["--preset", "composite-cpu", "--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=60",
        "--set", "train.eval_every=20", "--set", "train.checkpoint_every=20", "--set", "train.eval_size=200",
        "--set", "train.batch_size=32", "--set", "train.warmup_steps=5", "--no-progress"]


def files_of(folder):
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def composite_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("timeline") / "composite"
    assert main(["train", "--out", str(run), "--set", "train.snapshots=6", *TINY]) == 0
    return run


def test_a_run_keeps_step_0_log_spaced_snapshots_and_its_final_weights_once(composite_run):
    entries = read_index(composite_run)
    assert [e.step for e in entries][0] == 0 and [e.step for e in entries][-1] < 60
    scheduled = [e.step for e in entries if "scheduled" in e.reasons]
    assert scheduled == scheduled_steps(6, 60) and len(scheduled) == 5  # with the final weights: 6 points
    events = [e for e in entries if "scheduled" not in e.reasons]  # the weights before accuracy jumped
    assert all(r.startswith("before step ") and "acc_seen moved" in r for e in events for r in e.reasons)
    with safe_open(str(composite_run / SNAPSHOTS / entries[-1].file), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}  # noqa: SIM118
    final, _ = verified_weights(composite_run)
    snapshot = read_snapshot(composite_run, entries[0])
    assert snapshot.keys() == final.keys()


def test_analyze_timeline_writes_timeline_json_with_the_tasks_evidence_and_a_report_section(composite_run, capsys):
    assert main(["analyze", str(composite_run), "--timeline", "--no-progress"]) == 0
    timeline = json.loads((composite_run / TIMELINE).read_text())
    steps = [p["step"] for p in timeline["points"]]
    assert timeline["schema"] == 1 and steps == [e.step for e in read_index(composite_run)] + [60]
    assert timeline["points"][-1]["reasons"] == ["final weights"]
    first = timeline["points"][0]
    assert first["label"] == "unlearned" and first["head_patching"] is None  # nothing to normalise by at init
    assert list(first["panels"]) == ["held-out answers", "x-10 by key position", "x-6 by key position"]
    summary = timeline["summary"]
    assert summary["final_label"] == timeline["points"][-1]["label"] and summary["decided_at"] in steps
    # the loss from step 0: every snapshot's weights on one test batch; the last agrees with the
    # training record's evaluation (another sample of the same split) and is below the first
    losses = [p["loss"] for p in timeline["points"]]
    recorded = [json.loads(line) for line in (composite_run / "metrics.jsonl").read_text().splitlines()]
    assert all(loss > 0 for loss in losses) and losses[-1] < losses[0]
    assert losses[-1] == pytest.approx([m for m in recorded if "eval_loss" in m][-1]["eval_loss"], rel=0.1)
    out = capsys.readouterr().out
    assert f"decided at step {summary['decided_at']}" in out
    page = (composite_run / REPORT).read_text()
    assert "Timeline: the solution through training" in page and f"decided at step {summary['decided_at']}" in page
    assert "weights, from step 0, on 256 test-split sequences" in page


def test_a_lego_timeline_reads_accuracy_per_variable_and_names_what_is_learned(built_once):
    run = lego_timeline_run(built_once)  # shared with test_browser_report
    point = json.loads((run / TIMELINE).read_text())["points"][-1]
    assert list(point["panels"]) == ["accuracy per variable"]
    assert list(point["panels"]["accuracy per variable"])[2] == "#2 (not supervised)"
    assert point["label"].endswith("learned") and len(point["head_labels"]) == 2


def test_a_run_without_snapshots_has_no_timeline_exit_2_and_nothing_written(tmp_path, capsys):
    run = tmp_path / "bare"
    assert main(["train", "--out", str(run), "--set", "train.snapshots=0", *TINY]) == 0
    assert not (run / SNAPSHOTS).exists()
    before = files_of(run)
    assert main(["analyze", str(run), "--timeline"]) == 2
    assert "has no snapshots" in capsys.readouterr().err
    assert files_of(run) == before


def test_a_snapshot_that_does_not_match_its_digest_is_exit_2_naming_it_and_nothing_written(composite_run, tmp_path,
                                                                                           capsys):
    import shutil

    run = tmp_path / "damaged"
    shutil.copytree(composite_run, run)
    (run / TIMELINE).unlink(missing_ok=True)
    entry = read_index(run)[2]
    path = run / SNAPSHOTS / entry.file
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    before = files_of(run)
    assert main(["analyze", str(run), "--timeline", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert entry.file in err and "digest" in err and "Traceback" not in err
    assert files_of(run) == before and not (run / ERROR_LOG).exists()


@pytest.mark.parametrize("value", ['"many"', "1", "[-5]", "2.5"])
def test_an_unknown_snapshots_value_is_exit_2_before_anything_is_written(tmp_path, capsys, value):
    assert main(["train", "--out", str(tmp_path / "x"), "--set", f"train.snapshots={value}", *TINY]) == 2
    assert "train.snapshots" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_resume_keeps_the_same_snapshots_as_an_uninterrupted_run(tmp_path, monkeypatch):
    cfg = tiny_composite_run(steps=30, snapshots=[0, 3, 12, 18, 27])
    Trainer(cfg, tmp_path / "whole", progress=False).fit()
    kill_then_resume(cfg, tmp_path / "killed", monkeypatch, at_step=21)  # after snapshot 18, past the checkpoint at 20
    whole, resumed = read_index(tmp_path / "whole"), read_index(tmp_path / "killed")
    assert [(e.step, e.digest) for e in whole] == [(e.step, e.digest) for e in resumed]
    assert [e.step for e in whole] == [0, 3, 12, 18, 27]


def test_sweep_cells_and_curriculum_stages_keep_snapshots(tmp_path):
    results = run_cells({"a": tiny_composite_run(steps=12, snapshots=3)}, tmp_path / "sweep", workers=1, progress=False)
    assert results["a"].status == "done"
    assert [e.step for e in read_index(tmp_path / "sweep" / "a")] == [0, 1]  # 3 points: 0, 1 (log-spaced) and the final
    train_curriculum(TINY_CURRICULUM, tmp_path / "curriculum", progress=False)
    for stage in ("1", "2"):
        assert read_index(tmp_path / "curriculum" / stage)[0].step == 0
        assert (tmp_path / "curriculum" / stage / SNAPSHOTS / INDEX).exists()
    assert load_run(tmp_path / "curriculum" / "2").config.heads_origin == "warm-started"
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "curriculum" / "2" / SNAPSHOTS))
