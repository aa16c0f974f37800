"""Run folders that cannot be corrupted (issue 16): one writer per folder, resume that checks what
it resumes, folders usable again after a crash, damaged files as exit 2 naming the file."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from analyses.cli import main
from models.runs import LOCK, METRICS, TRAIN_STATE, WEIGHTS, read_metrics, run_lock
from models.train import Trainer
from tests.helpers import folder_bytes, tiny_composite_run
from tests.processes import start, start_cli

SHORT = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=40",
         "--set", "train.batch_size=16", "--set", "train.eval_every=20", "--set", "train.checkpoint_every=20",
         "--set", "train.eval_size=200", "--no-progress"]


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / WEIGHTS)), load_file(str(b / WEIGHTS))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def two_writers(tmp_path: Path, rounds: int) -> None:
    """Two trainings of different configs into one folder, started together: exactly one trains,
    the other exits 2, and the folder is the winner's run alone."""
    configs = {"a": ["--set", "train.seed=0"], "b": ["--set", "train.seed=1", "--set", "train.lr=3e-3"]}
    for name, extra in configs.items():
        assert main(["train", "--preset", "composite-cpu", "--out", str(tmp_path / f"ref-{name}"), *SHORT, *extra]) == 0
    for round_ in range(rounds):
        out = tmp_path / f"race{round_}"
        procs = {name: start_cli("train", "--preset", "composite-cpu", "--out", str(out), *SHORT, *extra, cwd=tmp_path)
                 for name, extra in configs.items()}
        codes = {name: proc.wait(timeout=300) for name, proc in procs.items()}
        errors = {name: proc.stderr() for name, proc in procs.items()}
        assert sorted(codes.values()) == [0, 2], (codes, errors)
        winner = next(name for name, code in codes.items() if code == 0)
        loser = next(name for name in codes if name != winner)
        assert "being written by another process (pid" in errors[loser] or "already holds a run" in errors[loser]
        assert same_weights(out, tmp_path / f"ref-{winner}")
        stored = json.loads((out / "config.json").read_text())["train"]
        assert stored["seed"] == (0 if winner == "a" else 1)
        records = read_metrics(out)
        assert [r["step"] for r in records] == [20, 40]
        reference = read_metrics(tmp_path / f"ref-{winner}")
        assert [r["eval_loss"] for r in records] == [r["eval_loss"] for r in reference]
        assert not (out / LOCK).exists()


def test_two_writers_into_one_folder_one_trains_the_other_exits_2(tmp_path):
    two_writers(tmp_path, rounds=1)


@pytest.mark.slow
def test_two_writers_into_one_folder_twenty_times(tmp_path):
    two_writers(tmp_path, rounds=20)


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    out = tmp_path / "run"
    with run_lock(out):
        assert (out / LOCK).read_text() == str(os.getpid())
        other = start_cli("train", "--preset", "composite-cpu", "--out", str(out), *SHORT, cwd=tmp_path)
        assert other.wait(timeout=120) == 2
        assert f"pid {os.getpid()}" in other.stderr()
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # the refused writer wrote nothing
    assert not (out / LOCK).exists()


def holds_the_lock(out: str) -> int:
    """Takes the run folder's lock, as a trainer does, and keeps it (until killed)."""
    import time

    with run_lock(out):
        time.sleep(120)
    return 0


def dies_holding_the_lock(out: str) -> int:
    with run_lock(out):
        os.kill(os.getpid(), 9)
    return 0


def test_reading_a_run_in_training_warns_that_it_is_a_checkpoint(tmp_path):
    import time

    from models.runs import load_run
    from models.safe_files import writer_pid

    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    holder = start(holds_the_lock, str(out))  # another process, as a trainer is
    try:
        deadline = time.monotonic() + 60
        while writer_pid(out) != str(holder.pid):
            assert holder.poll() is None and time.monotonic() < deadline, holder.stderr()
            time.sleep(0.02)
        with pytest.warns(UserWarning, match=f"being trained by pid {holder.pid}"):
            load_run(out)
    finally:
        holder.send_signal(9)
        holder.wait(timeout=60)
    with run_lock(out), warnings.catch_warnings():  # this process's own lock (analyze holds it): no warning
        warnings.simplefilter("error")
        load_run(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run(out)  # no writer: no warning


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    holder = start(dies_holding_the_lock, str(out))
    assert holder.wait(timeout=60) == -9
    assert (out / LOCK).exists()  # the killed holder could not clean up
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    assert not (out / LOCK).exists()


def train_dying_at(out: Path, kill_at: str) -> int:
    """`workbench train` of the composite-cpu preset that dies (exit 9) after the train state of
    step `kill_at` is written and before its weights are."""
    import models.runs

    original = models.runs.save_tensors

    def dying_save(path, tensors, meta=None):
        if path.name == WEIGHTS and meta and meta["step"] == kill_at:
            os._exit(9)
        return original(path, tensors, meta)

    models.runs.save_tensors = dying_save
    return main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT])


def test_a_kill_between_the_two_checkpoint_files_resumes_to_the_uninterrupted_weights(tmp_path):
    """Killed after train_state is written and before model.safetensors, at the last step: the
    weights file is the previous checkpoint's. Resume notices and restores it. Both runs train
    in a process of their own with one thread, so their floating-point sums agree bit for bit."""
    assert start(train_dying_at, tmp_path / "whole", "never").wait(timeout=300) == 0
    out = tmp_path / "killed"
    assert start(train_dying_at, out, "40").wait(timeout=300) == 9
    assert not same_weights(out, tmp_path / "whole")  # the stale weights of step 20
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.warns(UserWarning, match="holds the weights of step 20, not those of the train state's step 40"):
            assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert same_weights(out, tmp_path / "whole")


@pytest.mark.parametrize("damage", ["deleted", "truncated", "garbage"])
def test_resume_restores_missing_or_damaged_weights_of_a_finished_run(tmp_path, damage):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / WEIGHTS).write_bytes((out / WEIGHTS).read_bytes())
    weights = out / WEIGHTS
    if damage == "deleted":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        weights.write_bytes(os.urandom(4000))
    with pytest.warns(UserWarning, match=f"rewritten from {TRAIN_STATE}"):
        assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert same_weights(out, tmp_path / "whole")


def test_a_damaged_train_state_is_exit_2_naming_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    (out / TRAIN_STATE).write_bytes(b"\x00" * 64)
    before = folder_bytes(out)
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert f"{out / TRAIN_STATE} is damaged" in capsys.readouterr().err
    assert folder_bytes(out) == before


def test_a_crash_before_the_first_checkpoint_leaves_a_folder_that_resumes_from_step_0(tmp_path, monkeypatch):
    cfg = tiny_composite_run(steps=20)
    Trainer(cfg, tmp_path / "whole", progress=False).fit()
    out = tmp_path / "crashed"
    crashed = Trainer(cfg, out, progress=False)
    monkeypatch.setattr(crashed, "_next_batch", lambda: (_ for _ in ()).throw(MemoryError("out of memory")))
    with pytest.raises(MemoryError):
        crashed.fit()
    assert (out / "config.json").exists() and not (out / TRAIN_STATE).exists()
    with pytest.warns(UserWarning, match="starting from step 0"):
        assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert same_weights(out, tmp_path / "whole")
    assert read_metrics(out)
    assert [r["step"] for r in read_metrics(out)] == [r["step"] for r in read_metrics(tmp_path / "whole")]


def test_a_damaged_last_metrics_line_is_dropped_with_a_warning_an_earlier_one_is_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    lines = (out / METRICS).read_text().splitlines()
    (out / METRICS).write_text("\n".join(lines) + '\n{"step": 60, "train_lo')  # a crash in mid-write
    with pytest.warns(UserWarning, match="dropped its damaged last line 3"):
        assert main(["report", str(out)]) == 0
    (out / METRICS).write_text("\n".join([lines[0][:30], lines[1]]) + "\n")
    assert main(["report", str(out)]) == 2
    assert f"{out / METRICS}: line 1 is damaged" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_an_unreadable_config_is_exit_2_naming_the_file(tmp_path, capsys, content):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    (out / "config.json").write_bytes(content)
    for command in (["report", str(out)], ["analyze", str(out)], ["train", "--out", str(out), "--resume"]):
        assert main(command) == 2
        assert str(out / "config.json") in capsys.readouterr().err


def test_weight_files_are_as_readable_as_the_other_run_files(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes[WEIGHTS] == modes[TRAIN_STATE] == modes["config.json"], modes


@pytest.mark.parametrize("command", [["report"], ["analyze"], ["benchmark", "--patching"]])
def test_commands_on_a_missing_run_folder_exit_2_naming_it(tmp_path, capsys, command):
    missing = tmp_path / "nowhere"
    assert main([*command, str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not missing.exists()


def _killed_at_step_5_of_8(out: Path, monkeypatch) -> None:
    """A run of 8 steps killed after its checkpoint at step 4."""
    from tests.helpers import Killed

    trainer = Trainer(tiny_composite_run(steps=8, eval_every=4, checkpoint_every=4), out, progress=False)
    original = trainer._next_batch

    def dying_step():
        if trainer.step == 5:
            raise Killed
        return original()

    monkeypatch.setattr(trainer, "_next_batch", dying_step)
    with pytest.raises(Killed):
        trainer.fit()


def _shifted(tensors: dict, meta: dict) -> None:
    name = next(k for k in tensors if k.startswith("model."))
    tensors[name] = tensors[name] + 1.0


def _reshaped_weights(tensors: dict, meta: dict) -> None:  # with a digest that matches, so only the shape is wrong
    from models.runs import weights_digest

    name = next(k for k in tensors if k.startswith("model.") and tensors[k].dim() == 2)
    tensors[name] = tensors[name].t().contiguous()
    meta["digest"] = weights_digest({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})


TRAIN_STATE_DAMAGE = {  # name: (damage, what the message must say)
    "a weight shifted by 1.0": (_shifted, "digest"),
    "rng.depth missing": (lambda t, m: t.pop("rng.depth"), "rng.depth"),
    "rng.data of another size": (lambda t, m: t.update({"rng.data": t["rng.data"][:10]}), "rng.data"),
    "meta.step not an int": (lambda t, m: m.update(step="four"), "step"),
    "meta.digest missing": (lambda t, m: m.pop("digest"), "digest"),
    "meta.loss_sum not finite": (lambda t, m: m.update(loss_sum="nan"), "loss_sum"),
    "an optimizer moment missing": (lambda t, m: t.pop("optim.0.exp_avg_sq"), "optim.0"),
    "an optimizer moment of another shape": (lambda t, m: t.update({"optim.0.exp_avg": t["optim.0.exp_avg"][:1]}),
                                             "optim.0.exp_avg"),
    "an unknown optimizer entry": (lambda t, m: t.update({"optim.999.exp_avg": torch.zeros(1)}), "optim.999"),
    "a weight of another shape": (_reshaped_weights, "shape"),
}


@pytest.mark.parametrize("damage", list(TRAIN_STATE_DAMAGE))
def test_a_train_state_that_contradicts_itself_is_exit_2_and_changes_nothing(tmp_path, capsys, monkeypatch, damage):
    """A train state whose weights do not match their own digest (one tensor + 1.0 at step 4 of
    8), or that lacks a field or holds one of the wrong kind or shape, is refused with exit 2
    naming the file and the field; no file of the folder changes."""
    from safetensors.torch import save_file

    from models.runs import read_tensors

    out = tmp_path / "run"
    _killed_at_step_5_of_8(out, monkeypatch)
    tensors, meta = read_tensors(out / TRAIN_STATE)
    corrupt, named = TRAIN_STATE_DAMAGE[damage]
    corrupt(tensors, meta)
    save_file(tensors, str(out / TRAIN_STATE), metadata=meta)
    before = folder_bytes(out)
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(out / TRAIN_STATE) in err and named in err, err
    assert folder_bytes(out) == before


@pytest.mark.parametrize(("content", "wrong"), [
    ("{not json", "not JSON"), ("{}", "lacks"), ("[1]", "not a JSON object"), ('"text"', "not a JSON object"),
    (json.dumps({"run": "r", "task": "chess", "heads": {}, "patching": {}, "verdict": {}, "seconds": 1}),
     "task='chess'"),
    (json.dumps({"run": "r", "task": "composite", "heads": 5, "patching": {}, "verdict": {}, "seconds": 1}), "heads"),
    (json.dumps({"run": "r", "task": "composite", "heads": {"scores": 1}, "patching": {}, "verdict": {}, "seconds": 1}),
     "cannot be shown"),
    (json.dumps({"schema": 99, "run": "r", "task": "composite"}), "schema 99, newer than this workbench reads"),
], ids=["broken", "empty-object", "list", "string", "unknown-task", "heads-not-an-object", "heads-without-labels",
        "newer-schema"])
def test_report_on_a_damaged_analysis_json_is_exit_2_naming_it(tmp_path, capsys, composite_run, content, wrong):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(composite_run, out)
    (out / "analysis.json").write_text(content)
    capsys.readouterr()
    before = folder_bytes(out)
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out / "analysis.json") in err and wrong in err, err
    assert folder_bytes(out) == before


DEEP_DAMAGE = {  # a field the report draws, damaged in a real analysis.json: where, and what the message says
    "ragged-labels": (lambda a: a["heads"]["labels"].append(["x", "y"]), "heads.labels must be a grid"),
    "values-as-text": (lambda a: a["patching"]["heads"].update(values="[[0.1]]"), "patching.heads.values must be"),
    "evidence-of-another-shape": (lambda a: a["heads"]["scores"].update(extra=[[0.5]]), "heads.scores.extra is 1 x 1"),
    "verdict-without-rates": (lambda a: a["verdict"].pop("seen_accuracy"), "verdict lacks ['seen_accuracy']"),
    "probes-of-text": (lambda a: a["probes"].update(accuracy="high"), "probes.accuracy must be a list"),
    "edge-of-two": (lambda a: a["patching"]["paths"]["strongest"].append(["L0H0", "logits"]),
                    "must be a list of 3"),
}


@pytest.fixture(scope="module")
def composite_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("composite") / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *SHORT]) == 0
    return out


@pytest.mark.parametrize("damage", list(DEEP_DAMAGE))
def test_an_analysis_json_damaged_anywhere_the_report_reads_is_exit_2_naming_the_field(tmp_path, capsys,
                                                                                      composite_run, damage):
    """The report's code reads analysis.json without catching what a damaged file throws: the
    file is checked where it is read, against every field the report draws, and a damaged one
    is refused with exit 2 naming the file and the field; nothing is written."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(composite_run, out)
    analysis = json.loads((Path(__file__).parents[1] / "data" / "analysis-9f7496e-composite.json").read_text())
    damage_it, said = DEEP_DAMAGE[damage]
    _renders_then_is_refused(out / "analysis.json", analysis, damage_it, said, capsys)


# the files whose undamaged data `workbench report` rendered in a copy of `composite_run` in this process
_RENDERED: set[str] = set()


def _renders_then_is_refused(path: Path, data: dict, damage, said: str, capsys) -> None:
    """`data` written to `path` renders (`workbench report`); damaged, it is exit 2 naming the
    file and `said`, without a traceback, and the folder is left as it was. Each caller gives
    every damage the same undamaged `data` (but for the folder it names) in a copy of the same
    run, so it is rendered once per process and file (the first damage to run), not per damage."""
    path.write_text(json.dumps(data))
    if path.name not in _RENDERED:
        assert main(["report", str(path.parent)]) == 0
        _RENDERED.add(path.name)
    damage(data)
    path.write_text(json.dumps(data))
    capsys.readouterr()
    before = folder_bytes(path.parent)
    assert main(["report", str(path.parent)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and said in err and "Traceback" not in err, err
    assert folder_bytes(path.parent) == before


@pytest.mark.parametrize(("damage", "said"), [
    (lambda t: t["points"].clear(), "points must hold at least 1 item(s)"),
    (lambda t: t["points"][0].pop("reasons"), "points[0] lacks ['reasons']"),
    (lambda t: t["points"][0]["verdict"].pop("held_out_symmetric"), "points[0].verdict lacks ['held_out_symmetric']"),
    (lambda t: t["points"][0].update(head_patching=[[0.1, 0.2, 0.3]]), "points[0] has a head_patching of another"),
    (lambda t: t["summary"]["changes"].append({"step": "late"}), "summary.changes[0] lacks ['from', 'to']"),
    (lambda t: t.update(task="chess"), "task='chess'"),
], ids=["no-points", "point-without-reasons", "verdict-without-a-rate", "patching-of-another-shape",
        "change-without-labels", "unknown-task"])
def test_a_damaged_timeline_json_is_exit_2_naming_the_field(tmp_path, capsys, composite_run, damage, said):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(composite_run, out)
    verdict = {"verdict": "symmetric", "seen_accuracy": 1.0, "held_out_inferential": 0.1, "held_out_symmetric": 0.85,
               "held_out_other": 0.05}
    point = {"step": 40, "reasons": ["final weights"], "label": "symmetric", "panels": {"rates": {"seen": 1.0}},
             "head_labels": [["mixed"], ["mixed"]], "head_patching": [[0.5], [0.1]], "circuit": ["L0H0"],
             "verdict": verdict, "loss": 0.1}
    timeline = {"schema": 1, "run": str(out), "task": "composite", "points": [point],
                "summary": {"final_label": "symmetric", "decided_at": 40, "changes": [], "crossings": {},
                            "heads": {}}}
    _renders_then_is_refused(out / "timeline.json", timeline, damage, said, capsys)


def test_a_writer_whose_folder_another_writers_check_made_or_removed_still_gets_the_lock(tmp_path, monkeypatch):
    """The race the twenty-round test once hit: writer A's --out check makes the folder and removes
    it again. Writer B must then neither be refused as 'cannot be created' (the folder exists
    because A made it) nor crash opening its lock in a folder A just removed."""
    from models import safe_files
    from models.run_folder import RunFolder

    out = tmp_path / "race"
    real_mkdir = Path.mkdir

    def made_by_another_writer_first(self, *args, **kwargs):
        real_mkdir(self, parents=True, exist_ok=True)  # the other writer's check got there first
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", made_by_another_writer_first)
    RunFolder(out).check_creatable()  # no ConfigError: the folder exists, and the lock will decide
    monkeypatch.undo()
    out.rmdir()  # ... and the other writer's check removes it again before this writer locks
    fd = safe_files._acquire(out / safe_files.LOCK)
    try:
        assert (out / safe_files.LOCK).read_text() == str(os.getpid())
    finally:
        os.close(fd)
