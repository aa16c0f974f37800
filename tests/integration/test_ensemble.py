"""Runs trained as one stacked ensemble (models/train.py, `train_runs`) against the same runs
trained alone: each member's folder is a lone run's (config, metrics, weights + digest, train
state, snapshots), verified by the readers, resumable, and its weights are the lone run's: bit for
bit for a bias-free model without gradient clipping, within float rounding otherwise (a member's
gradient norm, and the gradients of biases, sums over the batch, are reduced in another order by
the batched kernels)."""

from __future__ import annotations

import json

import pytest
import torch

from models.ensemble import group_by_shape, kept_apart
from models.runs import load_run, run_state, verified_weights
from models.snapshots import read_index
from models.train import Trainer, TrainingDiverged, train_runs
from tests.helpers import Killed, tiny_composite_run

# every per-member setting an ensemble lets differ, one member each
SETTINGS = {"plain": [], "seed": ["train.seed=1"], "init_gamma": ["model.init_gamma=0.9"], "lr": ["train.lr=0.003"],
            "weight_decay": ["train.weight_decay=0.5"], "clip": ["train.grad_clip=0.05"],
            "no_clip": ["train.grad_clip=null"], "schedule": ["train.warmup_steps=5", "train.min_lr=0.0005"],
            "fewer_steps": ["train.steps=10"],
            "stop_rule": ["train.plateau_evals=1", "train.plateau_tol=0.99"]}  # stops at its second evaluation


def base(biases: bool = False):
    cfg = tiny_composite_run(steps=15, eval_every=5, checkpoint_every=5, snapshots=4, device="cpu")
    return cfg.with_overrides([f"model.biases={str(biases).lower()}"])


def records(folder) -> list[dict]:
    """metrics.jsonl without the wall-clock field, which no two runs share."""
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"} for line in lines]


ROUNDING = 1e-6  # measured: at most 1.3e-7 apart after 15 steps (a few float32 ulps)


def weights_apart(a, b) -> float:
    """The largest difference between two run folders' weights."""
    ours, theirs = verified_weights(a)[0], verified_weights(b)[0]
    return max((ours[k] - theirs[k]).abs().max().item() for k in ours)


def same_records(a, b, tol: float = 1e-5) -> bool:
    """Two runs' metrics: the same steps and fields, numbers within `tol`."""
    ra, rb = records(a), records(b)
    return len(ra) == len(rb) and all(
        x.keys() == y.keys() and all(abs(x[k] - y[k]) <= tol if isinstance(x[k], float) else x[k] == y[k] for k in x)
        for x, y in zip(ra, rb))


def train_both(tmp_path, cfgs: dict, **fit) -> list:
    for name, cfg in cfgs.items():
        Trainer(cfg, tmp_path / "alone" / name, progress=False).fit()
    members = [Trainer(cfg, tmp_path / "together" / name, progress=False) for name, cfg in cfgs.items()]
    return train_runs(members, progress=False, **fit)


def test_members_equal_lone_runs(tmp_path):
    cfgs = {name: base().with_overrides(extra) for name, extra in SETTINGS.items()}
    results = train_both(tmp_path, cfgs)
    for (name, cfg), result in zip(cfgs.items(), results):
        alone, together = tmp_path / "alone" / name, tmp_path / "together" / name
        assert run_state(together, cfg, repair=False) == "done", name
        ours, stamp = verified_weights(together)
        theirs, their_stamp = verified_weights(alone)
        if name == "no_clip":  # same step, same digest: the same weights, bit for bit
            assert stamp == their_stamp and records(together) == records(alone)
            assert [e.digest for e in read_index(together)] == [e.digest for e in read_index(alone)]
        assert stamp.step == their_stamp.step and weights_apart(together, alone) < ROUNDING, name
        assert same_records(together, alone), name
        assert [e.step for e in read_index(together)] == [e.step for e in read_index(alone)], name
        state = {k: v for k, v in load_run(together).model.state_dict().items()}
        assert all(torch.equal(state[k], ours[k]) for k in ours)
        assert result.steps == {"fewer_steps": 10, "stop_rule": 10}.get(name, 15), name
    assert records(tmp_path / "together" / "stop_rule")[-1]["stopped"] == "plateau"


def test_members_with_biases_equal_lone_runs_within_float_rounding(tmp_path):
    # composite-cpu's width and a larger batch: at the tiny width the sums happen to come out equal
    wide = ["model.d_model=128", "model.d_head=64", "model.d_mlp=384", "train.batch_size=32", "train.steps=12"]
    cfgs = {name: base(biases=True).with_overrides(wide + SETTINGS[name]) for name in ("plain", "seed", "lr", "clip")}
    train_both(tmp_path, cfgs)
    for name in cfgs:
        ours, _ = verified_weights(tmp_path / "together" / name)
        theirs, _ = verified_weights(tmp_path / "alone" / name)
        worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
        # measured 1e-5 .. 5e-4 after 12 steps at lr 1e-3 and 3e-3: Adam turns a rounding difference
        # in a near-zero gradient into an update of up to lr, so the bound is one step's lr
        assert worst < cfgs[name].train.lr, (name, worst)


def test_a_diverging_member_is_recorded_and_the_others_go_on(tmp_path):
    cfgs = {"plain": base(), "exploding": base().with_overrides(["train.lr=1e30", "train.grad_clip=null"])}
    train_both(tmp_path / "x", {"plain": cfgs["plain"]})  # the lone plain run, for comparison
    members = [Trainer(cfg, tmp_path / name, progress=False) for name, cfg in cfgs.items()]
    results = train_runs(members, progress=False)
    assert isinstance(results[1], TrainingDiverged)
    assert run_state(tmp_path / "exploding", cfgs["exploding"]) == "diverged"
    assert run_state(tmp_path / "plain", cfgs["plain"]) == "done"
    assert weights_apart(tmp_path / "plain", tmp_path / "x" / "alone" / "plain") < ROUNDING


def test_an_ensemble_killed_midway_resumes_to_the_lone_runs_weights(tmp_path, monkeypatch):
    cfgs = {name: base().with_overrides(SETTINGS[name]) for name in ("plain", "lr", "stop_rule")}
    for name, cfg in cfgs.items():
        Trainer(cfg, tmp_path / "alone" / name, progress=False).fit()
    members = [Trainer(cfg, tmp_path / name, progress=False) for name, cfg in cfgs.items()]
    original = members[0].after_step

    def dying_after_step():
        if members[0].step == 7:
            raise Killed
        return original()

    monkeypatch.setattr(members[0], "after_step", dying_after_step)
    with pytest.raises(Killed):
        train_runs(members, progress=False)
    assert all(run_state(tmp_path / name, cfg) == "partial" for name, cfg in cfgs.items())
    # two resumed together, one alone: a member's folder is a lone run's
    train_runs([Trainer(cfgs[n], tmp_path / n, resume=True, progress=False) for n in ("plain", "lr")], progress=False)
    Trainer(cfgs["stop_rule"], tmp_path / "stop_rule", resume=True, progress=False).fit()
    for name in cfgs:
        assert weights_apart(tmp_path / name, tmp_path / "alone" / name) < ROUNDING, name
        assert same_records(tmp_path / name, tmp_path / "alone" / name), name


def test_planted_heads_tied_layers_and_identity_attention_train_as_ensembles(tmp_path):
    cfgs = {"planted": base().with_overrides(['model.planted={"1.0": "association"}']),
            "tied": base().with_overrides(["model.tie_layers=true", "model.shared_qk=true"]),
            "identity": base().with_overrides(["model.identity_attention=true", "train.identity_lr_scale=10"])}
    for name, cfg in cfgs.items():
        seeds = {f"{name}-{s}": cfg.with_overrides([f"train.seed={s}", "train.steps=10"]) for s in (0, 1)}
        train_both(tmp_path, seeds)
        for run in seeds:
            assert weights_apart(tmp_path / "together" / run, tmp_path / "alone" / run) < ROUNDING, run


def test_group_by_shape_keeps_apart_what_an_ensemble_cannot_train():
    cell = base()
    cells = {"a": cell, "b": cell.with_overrides(["train.seed=3", "model.init_gamma=0.3", "train.lr=0.01"]),
             "deeper": cell.with_overrides(["model.n_layers=3"]), "deeper2": cell.with_overrides(["model.n_layers=3"]),
             "compiled": cell.with_overrides(["train.compile=true"]),
             "compiled2": cell.with_overrides(["train.compile=true", "train.seed=2"]),
             "bf16": cell.with_overrides(["train.precision=bf16"]),
             "depth": cell.with_overrides(["model.min_depth=1"]), "depth2": cell.with_overrides(["model.min_depth=1"]),
             "batch": cell.with_overrides(["train.batch_size=8"])}
    # compiled runs stack with compiled runs, bf16 with bf16; stochastic depth trains alone
    assert group_by_shape(cells) == [["a", "b"], ["deeper", "deeper2"], ["compiled", "compiled2"], ["bf16"], ["depth"],
                                     ["depth2"], ["batch"]]
    assert kept_apart(cells["compiled"]) is None and kept_apart(cells["bf16"]) is None
    assert "stochastic depth" in kept_apart(cells["depth"])
    assert kept_apart(cells["b"]) is None
