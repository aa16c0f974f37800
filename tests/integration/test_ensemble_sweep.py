"""Sweeps with --ensemble (analyses/runners/ensemble.py): same-shape cells trained as one ensemble
end as the cells trained alone; `workbench benchmark --ensemble K` prints its ratio lines."""

from __future__ import annotations

import json

import pytest
import torch

from analyses.cli import main
from analyses.runners.ensemble import ensembles
from analyses.runners.sweep import run_cells
from models.presets import get_preset
from models.runs import TRAIN_STATE, verified_weights
from tests.helpers import kill_at, tiny_composite_run


def cells():
    base = tiny_composite_run(steps=10, device="cpu", snapshots=0).with_overrides(["model.biases=false"])
    grid = {f"s{seed}": base.with_overrides([f"train.seed={seed}"]) for seed in (0, 1)}
    return {**grid, "wide": base.with_overrides(["model.d_model=64"]), "lr": base.with_overrides(["train.lr=0.01"])}


def test_a_sweep_trains_same_shape_cells_together_with_the_weights_of_cells_trained_alone(tmp_path, monkeypatch):
    import models.train

    groups = []
    original = models.train.train_runs
    monkeypatch.setattr(models.train, "train_runs", lambda m, **kw: groups.append(len(m)) or original(m, **kw))
    together = run_cells(cells(), tmp_path / "on", progress=False, ensemble="on")
    alone = run_cells(cells(), tmp_path / "off", progress=False, ensemble="off")
    # on: s0, s1 and lr as one ensemble, "wide" (another shape) alone; off: four lone runs (ensembles of one)
    assert groups == [3, 1, 1, 1, 1, 1]
    for name in cells():
        assert together[name].status == alone[name].status == "done"
        ours, theirs = verified_weights(tmp_path / "on" / name)[0], verified_weights(tmp_path / "off" / name)[0]
        # within float rounding: a member's clipping norm is one row of a batched reduction (docs/ensembles.md)
        assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-6, name
    index = json.loads((tmp_path / "on" / "cells.json").read_text())
    assert sorted(index) == sorted(cells())
    again = run_cells(cells(), tmp_path / "on", progress=False, ensemble="on")  # finished: nothing retrained
    assert len(groups) == 6 and all(r.status == "done" for r in again.values())


def test_auto_trains_cells_alone_on_the_cpu_and_on_and_off_mean_what_they_say(monkeypatch):
    """auto: alone on the CPU (the phase diagram was slower as ensembles there, and lone runs stay
    bit-identical to earlier ones), ensembles on CUDA; on and off on any device."""
    import models.device

    for preset in ("lego-cpu", "composite-matched"):
        assert not ensembles("auto", get_preset(preset).with_overrides(["train.device=cpu"]))
    assert ensembles("on", tiny_composite_run(device="cpu"))
    assert not ensembles("off", get_preset("composite-matched"))
    monkeypatch.setattr(models.device, "resolve_device", lambda name, setting="": torch.device("cuda"))
    assert ensembles("auto", get_preset("composite-matched"))


def test_the_ensemble_benchmark_prints_each_way_and_a_ratio_per_shape(capsys):
    assert main(["benchmark", "--ensemble", "2", "--quick"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "member-steps/s" in line]
    assert [line.split(" ")[0] for line in lines] == ["composite-matched", "lego-cpu"]
    for line in lines:
        assert "lone eager" in line and "of peak" in line and "ensemble / lone:" in line
        assert ("lone compiled" in line and "ensemble compiled" in line) or "ensemble eager" in line


@pytest.mark.parametrize("damaged_file", [TRAIN_STATE, "snapshots"])
def test_a_damaged_member_leaves_its_group_with_its_own_error_and_the_others_train_on(tmp_path, damaged_file):
    """Two partial cells of one shape, one with a damaged train state (or a snapshots/ that links
    to another folder), resumed with --ensemble on: the healthy one finishes, the damaged one is
    failed naming its own file."""
    from tests.integration.hostile_damage import damage

    base = tiny_composite_run(steps=20, device="cpu", snapshots=0)
    grid = {f"s{seed}": base.with_overrides([f"train.seed={seed}"]) for seed in (0, 1)}
    for name, cfg in grid.items():
        kill_at(cfg, tmp_path / name)  # train state of step 10, metrics to 15
    damaged = tmp_path / "s1" / damaged_file
    if damaged_file == TRAIN_STATE:
        damage(damaged, "flip-weights", tmp_path)
    else:
        (tmp_path / "elsewhere").mkdir()
        damaged.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    results = run_cells(grid, tmp_path, progress=False, ensemble="on")
    assert results["s0"].status == "done", results["s0"].error
    assert results["s1"].status == "failed" and str(damaged) in results["s1"].error
    assert str(tmp_path / "s0") not in results["s1"].error
    verified_weights(tmp_path / "s0")
    if damaged_file != TRAIN_STATE:
        assert not list((tmp_path / "elsewhere").iterdir())  # nothing written through the link
