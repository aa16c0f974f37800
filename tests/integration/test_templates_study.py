"""The template studies at the tiny scale: every cell trains, the analyses run end to end, and the
report and results hold what the RESULTS.md block quotes."""

import json

import pytest

from analyses.runners.study import all_studies, run_study
from analyses.studies.templates import data_factors


@pytest.mark.parametrize("name", ["templates-efficiency", "templates-copy-width", "templates-heads"])
def test_study_runs_at_tiny_scale_and_writes_its_report(name, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_THREADS", "1")  # run_cells sets torch threads from it; one is fastest here
    assert name in all_studies()
    results = run_study(name, tmp_path, "tiny", progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["headline"] == json.loads(json.dumps(results["headline"], default=float))
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    cells = json.loads((tmp_path / "runs" / "cells.json").read_text())
    assert cells and all(c["status"] == "done" for c in cells.values())
    if name == "templates-efficiency":  # the headline's losses, recomputed from the runs' own metrics
        for variant in ("plain", "augmented"):
            finals = [json.loads((tmp_path / "runs" / f"{variant}-n8-s{seed}" / "metrics.jsonl").read_text()
                                 .splitlines()[-1])["eval_loss"] for seed in saved["seeds"]]
            assert saved["headline"][f"{variant}_loss_at_max_n"] == pytest.approx(sum(finals) / len(finals))
    if name == "templates-heads":
        augmented = saved["analyses"]["augmented-same_different"]
        assert len(augmented["a_h"]) == 2 and "acc_without_a" in augmented
        assert "a_h" not in saved["analyses"]["plain-same_different"]


def test_data_factors_reads_the_smallest_n_reaching_each_loss():
    losses = {"plain": {4: 0.9, 16: 0.5, 64: 0.1}, "augmented": {4: 0.5, 16: 0.08, 64: 0.05}}
    rows = {r["loss"]: r for r in data_factors(losses)}
    assert rows[0.1] == {"loss": 0.1, "n_plain": 64, "n_augmented": 16, "factor": 4.0}
    assert rows[0.5]["factor"] == 4.0 and rows[0.9]["n_augmented"] == 4
    assert data_factors({"plain": {4: 0.1}, "augmented": {4: 0.3}})[0]["factor"] is None
    # a plain mean with more digits than the reported loss still counts as reached at its own n
    row = data_factors({"plain": {4: 0.67141235, 16: 0.1}, "augmented": {4: 0.9, 16: 0.05}})[0]
    assert row == {"loss": 0.671412, "n_plain": 4, "n_augmented": 16, "factor": 0.25}


def test_sweep_reader_lists_each_run_and_the_factor_per_identity_lr_scale(tmp_path, capsys):
    """`python -m analyses.studies.templates DIR...` on runs trained outside a study: one row per
    run with its last test loss, |a_h| and |b_h| read from the augmented model's weights, and
    the plain-vs-augmented factors per identity lr scale."""
    import dataclasses

    from analyses.studies.templates import cell_config, main, sweep_factors, sweep_means, sweep_rows
    from models.runs import load_run
    from models.train import Trainer

    def train(name, n, augmented, lr_scale=1.0):
        cfg = cell_config("tiny", "same_different", n, augmented)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, identity_lr_scale=lr_scale))
        Trainer(cfg, tmp_path / name, progress=False).fit()

    for n in (4, 8):
        train(f"plain-{n}", n, False)
        train(f"aug-{n}", n, True)
    (tmp_path / "lr10").mkdir()
    train("lr10/aug-4", 4, True, lr_scale=10.0)
    rows = {r["run"].split(str(tmp_path) + "/")[1]: r for r in sweep_rows([tmp_path, tmp_path / "lr10"])}
    assert sorted(rows) == ["aug-4", "aug-8", "lr10/aug-4", "plain-4", "plain-8"]
    last = json.loads((tmp_path / "aug-8" / "metrics.jsonl").read_text().splitlines()[-1])
    aug = rows["aug-8"]
    assert (aug["test_loss"], aug["steps"], aug["stopped"]) == (last["eval_loss"], 10, "budget")
    model = load_run(tmp_path / "aug-8").model
    assert rows["aug-8"]["max_abs_a_h"] == round(max(b.attn.identity_a.abs().max().item() for b in model.blocks), 4)
    assert "max_abs_a_h" not in rows["plain-8"]
    factors = sweep_factors(list(rows.values()))
    assert [(f["template"], f["d_model"], f["augmented"]) for f in factors] == [
        ("same_different", 16, "identity_lr_scale 1.0"), ("same_different", 16, "identity_lr_scale 10.0")]
    unfinished = {**rows["plain-4"], "n": 2, "test_loss": 0.0, "stopped": "unfinished"}  # left out, not counted
    assert sweep_factors([*rows.values(), unfinished]) == factors
    with pytest.raises(ValueError, match="two plain runs .* with n = 4"):
        sweep_factors([*rows.values(), rows["plain-4"]])
    # another width is a group of its own, not a second n = 4; its n for error < 0.05 is read per variant
    wider = [{**rows["plain-4"], "d_model": 32, "test_error": 0.2},
             {**rows["plain-8"], "d_model": 32, "test_error": 0.01},
             {**rows["aug-4"], "d_model": 32, "test_error": 0.0}, {**rows["aug-8"], "d_model": 32, "test_error": 0.3}]
    by_width = {(f["d_model"], f["augmented"]): f for f in sweep_factors([*rows.values(), *wider])}
    assert by_width[(16, "identity_lr_scale 1.0")] == factors[0]
    assert by_width[(32, "identity_lr_scale 1.0")]["n_to_error_below_0.05"] == {"plain": 8, "augmented": 4}
    assert (32, "identity_lr_scale 10.0") not in by_width  # no plain-vs-lr10 pair at that width
    # seeds are compared within, not refused or averaged; a plain model at another lr is a curve of its own
    reseeded = [{**r, "seed": 1} for r in rows.values()]
    other_lr = {**rows["plain-4"], "lr": 3e-2}
    both = sweep_factors([*rows.values(), *reseeded, other_lr])
    assert [(f["seed"], f["augmented"], f["plain_lr"]) for f in both] == [
        (0, "identity_lr_scale 1.0", rows["plain-4"]["lr"]), (0, "identity_lr_scale 1.0", 3e-2),
        (0, "identity_lr_scale 10.0", rows["plain-4"]["lr"]), (0, "identity_lr_scale 10.0", 3e-2),
        (1, "identity_lr_scale 1.0", rows["plain-4"]["lr"]), (1, "identity_lr_scale 10.0", rows["plain-4"]["lr"])]
    assert [f for f in both if f["seed"] == 1] == [{**f, "seed": 1} for f in factors]
    means = sweep_means([*rows.values(), *reseeded])
    assert len(means) == 5 and all(m["seeds"] == [0, 1] and m["test_error_std"] == 0.0 for m in means)
    plain_4 = next(m for m in means if (m["variant"], m["n"]) == ("plain", 4))
    assert plain_4["test_loss_mean"] == round(rows["plain-4"]["test_loss"], 4)
    assert sweep_means(list(rows.values())) == []  # one seed per n: nothing to average
    assert main([str(tmp_path), str(tmp_path / "lr10")]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 5 + 2 and json.loads(printed[-1])["augmented"] == "identity_lr_scale 10.0"
    assert main([str(tmp_path / "lr10" / "aug-4")]) == 2  # a run folder, not a folder of runs
    assert main([str(tmp_path / "nowhere")]) == 2
