"""The template studies at the tiny scale: every cell trains, the analyses run end to end, and the
report and results hold what the RESULTS.md block quotes."""

import json

import pytest

from analyses.studies.templates import data_factors
from analyses.study import all_studies, run_study


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
