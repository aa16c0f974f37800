"""Snapshots (models/snapshots.py): which steps are kept, the events that keep more, and how a
kept snapshot is verified on reading; and the timeline's summary (interp/timeline.py)."""

import json

import pytest
import torch

from interp.timeline import summarize
from models.presets import get_preset
from models.snapshots import (
    INDEX,
    SNAPSHOTS,
    EventWatch,
    SnapshotKeeper,
    read_index,
    read_snapshot,
    scheduled_steps,
)
from tasks import ConfigError


def test_a_count_keeps_step_0_and_log_spaced_steps_below_the_last_and_a_list_keeps_its_own():
    steps = scheduled_steps(20, 3000)
    assert steps[0] == 0 and steps == sorted(set(steps)) and steps[-1] < 3000
    assert 15 <= len(steps) <= 19  # 18 asked; rounding merges a few of the first ones
    gaps = [b / a for a, b in zip(steps[2:], steps[3:])]
    assert max(gaps) / min(gaps) < 1.6  # log-spaced: a near-constant ratio once past rounding
    assert scheduled_steps(2, 100) == [0]  # step 0 and the final weights
    assert scheduled_steps([0, 50, 100, 5000], 100) == [0, 50]  # the final weights and beyond: not stored again
    assert scheduled_steps(0, 100) == []


@pytest.mark.parametrize("bad", ["1", "-3", '"many"', "2.5", "true", "[5, 5]", "[-1, 4]", '["a"]'])
def test_an_unknown_snapshots_value_is_refused_with_what_to_give(bad):
    with pytest.raises(ConfigError, match="train.snapshots"):
        get_preset("lego-cpu").with_overrides([f"train.snapshots={bad}"])


def test_a_loss_spike_is_an_event_once_and_noise_at_a_tiny_loss_is_not():
    watch = EventWatch(loss_factor=4.0, watch=[], delta=0.2)
    losses = [2.0, 0.5, 1e-7, 8e-7, 1e-7, 0.19, 0.3, 0.01, 0.25]
    events = [watch.update({"train_loss": loss}) for loss in losses]
    assert [bool(e) for e in events] == [False, False, False, False, False, True, False, False, True]
    assert "loss spike" in events[5][0] and "running minimum 1e-07" in events[5][0]


def test_a_watched_rate_moving_more_than_delta_is_an_event_and_a_small_move_is_not():
    watch = EventWatch(loss_factor=None, watch=["held_out_inferential"], delta=0.2)
    rates = [0.0, 0.1, 0.45, 0.5, 0.13]
    events = [watch.update({"held_out_inferential": r}) for r in rates]
    assert [bool(e) for e in events] == [False, False, True, False, True]
    assert events[4] == ["held_out_inferential moved 0.500 -> 0.130"]


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 2), value), "b": torch.tensor([value, 1e6])}  # 1e6: beyond float16


def test_the_keeper_stores_the_held_weights_before_an_event_and_reads_them_back_verified(tmp_path):
    keeper = SnapshotKeeper(tmp_path, [0, 7], EventWatch(4.0, [], 0.2))
    keeper.start(weights(0.0))
    keeper.after_step(7, weights(0.7))
    keeper.at_evaluation(10, {"train_loss": 1.0}, weights(1.0))
    keeper.at_evaluation(20, {"train_loss": 0.001}, weights(2.0))
    reasons = keeper.at_evaluation(30, {"train_loss": 0.5}, weights(3.0))  # the spike: step 20's weights are kept
    assert reasons and reasons[0].startswith("loss spike")
    entries = read_index(tmp_path)
    assert [e.step for e in entries] == [0, 7, 20]
    assert entries[2].reasons[0].startswith("before step 30: loss spike")
    kept = read_snapshot(tmp_path, entries[2])
    assert kept["w"].dtype == torch.float32 and torch.equal(kept["w"], torch.full((3, 2), 2.0))
    assert kept["b"][1].item() == 1e6  # a tensor float16 cannot hold is stored in float32


def test_a_damaged_snapshot_or_index_is_refused_naming_the_file(tmp_path):
    keeper = SnapshotKeeper(tmp_path, [0], EventWatch(None, [], 0.2))
    keeper.start(weights(0.5))
    entry, = read_index(tmp_path)
    path = tmp_path / SNAPSHOTS / entry.file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"{entry.file} does not match its digest"):
        read_snapshot(tmp_path, entry)
    index = tmp_path / SNAPSHOTS / INDEX
    index.write_text(json.dumps({"schema": 1, "snapshots": [{"step": 0, "file": "../model.safetensors"}]}))
    with pytest.raises(ConfigError, match="is not a snapshot"):
        read_index(tmp_path)


def test_resume_drops_the_snapshots_after_its_checkpoint_and_files_no_index_lists(tmp_path):
    keeper = SnapshotKeeper(tmp_path, [0, 5, 9], EventWatch(None, [], 0.2))
    keeper.start(weights(0.0))
    keeper.after_step(5, weights(0.5))
    keeper.after_step(9, weights(0.9))
    (tmp_path / SNAPSHOTS / "step-0000012.safetensors").write_bytes(b"left by a kill before its index")
    again = SnapshotKeeper(tmp_path, [0, 5, 9], EventWatch(None, [], 0.2))
    again.resume(6, [], weights(0.6))
    assert [e.step for e in read_index(tmp_path)] == [0, 5]
    assert sorted(p.name for p in (tmp_path / SNAPSHOTS).iterdir()) == [
        "index.json", "step-0000000.safetensors", "step-0000005.safetensors"]


def point(step: int, label: str, share: float | None = None, rate: float = 0.0) -> dict:
    return {"step": step, "label": label, "panels": {"answers": {"x-10": rate}},
            "head_labels": [["association" if share else "mixed"]],
            "head_patching": None if share is None else [[share]], "circuit": ["L0H0"] if share else []}


def test_the_summary_says_when_the_verdict_settled_every_change_and_when_each_head_formed():
    points = [point(0, "unlearned"), point(10, "mixed", 0.1, 0.3), point(20, "inferential", 0.5, 0.8),
              point(40, "symmetric", 0.6, 0.1), point(80, "inferential", 0.7, 0.96),
              point(160, "inferential", 0.7, 0.97)]
    summary = summarize(points)
    assert summary["final_label"] == "inferential" and summary["decided_at"] == 80
    assert [(c["step"], c["from"], c["to"]) for c in summary["changes"]] == [
        (10, "unlearned", "mixed"), (20, "mixed", "inferential"), (40, "inferential", "symmetric"),
        (80, "symmetric", "inferential")]
    assert summary["crossings"]["answers"]["x-10"] == {"0.5": 20, "0.75": 20, "0.95": 80}
    assert summary["heads"]["L0H0"] == {"carrier_from": 20, "circuit_from": 10, "labels": {"association": 10}}
