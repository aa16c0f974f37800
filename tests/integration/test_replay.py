"""Replay from a moment (`train.keep_state`, event snapshots, `workbench train --from RUN@STEP`):
a run forked from a kept training state with nothing changed retraces the source bit for bit on
the CPU; with a setting changed it is the counterfactual, its folder a run like any other."""

import json

import pytest

from analyses.cli import main
from models.runs import INIT, load_run, read_config, run_state, verified_weights
from models.snapshots import read_index
from models.train import Trainer
from tasks import ConfigError
from tests.helpers import tiny_composite_run


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay") / "source"
    # batches in epochs over a fixed set of 40 (2 batches each), so a replay must find its place in the epochs
    Trainer(tiny_composite_run(steps=20, eval_every=5, checkpoint_every=10, snapshots=4, keep_state=[7, 15],
                               n_train=40, sampling="epochs"), out, progress=False).fit()
    return out


def test_the_kept_states_are_listed_and_readable(source):
    from models.run_folder import RunFolder

    assert RunFolder(source).kept_moments() == [7, 15]


def test_a_replay_with_nothing_changed_retraces_the_run_bit_for_bit(source, tmp_path):
    out = tmp_path / "again"
    assert main(["train", "--from", f"{source}@7", "--out", str(out), "--no-progress"]) == 0
    assert run_state(out, read_config(out)) == "done"
    assert verified_weights(out)[1] == verified_weights(source)[1]  # same step, same digest
    ours = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]
    theirs = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
              for line in (source / "metrics.jsonl").read_text().splitlines()]
    assert ours == theirs
    assert [e.digest for e in read_index(out)] == [e.digest for e in read_index(source)]
    assert json.loads((out / INIT).read_text())["step"] == 7


def test_a_replay_with_a_setting_changed_is_the_counterfactual(source, tmp_path):
    out = tmp_path / "f64"
    assert main(["train", "--from", f"{source}@15", "--out", str(out), "--no-progress",
                 "--set", "train.loss_dtype=float64", "--set", "train.adam_eps=1e-6",
                 "--set", "train.softmax=stablemax"]) == 0
    cfg = read_config(out)
    assert (cfg.train.loss_dtype, cfg.train.adam_eps, cfg.train.softmax) == ("float64", 1e-6, "stablemax")
    assert verified_weights(out)[1].step == 20
    assert verified_weights(out)[1].digest != verified_weights(source)[1].digest
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    source_records = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines()]
    assert records[:3] == source_records[:3]  # the path up to step 15 is the source's
    assert load_run(out).metrics[-1]["step"] == 20


def test_a_step_without_a_kept_state_is_exit_2_naming_the_kept_ones(source, tmp_path, capsys):
    assert main(["train", "--from", f"{source}@9", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no training state at step 9" in err and "[7, 15]" in err
    assert not (tmp_path / "x").exists()


def test_keep_state_outside_the_run_is_a_config_error():
    with pytest.raises(ConfigError, match="keep_state"):
        tiny_composite_run(steps=20, keep_state=[0, 21])


def test_an_event_snapshot_keeps_the_state_before_the_event(tmp_path):
    """A loss factor of 1.0001 makes nearly every evaluation an event: the state of the
    evaluation before each is kept beside its snapshot."""
    out = tmp_path / "events"
    cfg = tiny_composite_run(steps=20, eval_every=5, checkpoint_every=10, snapshots=2,
                             snapshot_loss_factor=1.0001, snapshot_watch=["acc_seen"], snapshot_watch_delta=1e-4)
    Trainer(cfg, out, progress=False).fit()
    from models.run_folder import RunFolder

    events = {e.step for e in read_index(out) if any(r != "scheduled" for r in e.reasons)}
    kept = RunFolder(out).kept_moments()
    assert kept and set(kept) <= events
