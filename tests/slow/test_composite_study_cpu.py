"""The composite phase diagram at cpu scale keeps its promise: 7 gammas x 4 depths x 3 seeds,
each run to the stop rule, within an hour on two cores (two local workers), with a verdict per
cell. `make test-slow`."""

import time

import pytest

from analyses.runners.study import run_study

pytestmark = pytest.mark.slow


def test_cpu_phase_diagram_finishes_within_an_hour_with_a_verdict_per_cell(tmp_path):
    started = time.perf_counter()
    results = run_study("composite-phase", tmp_path, "cpu", workers=2, progress=False)
    assert time.perf_counter() - started < 3600
    assert results["headline"]["failed_runs"] == 0
    table = results["table"]
    assert len(table) == 28 and all(cell["seeds"] == 3 for cell in table.values())
    # the small-init end learns the seen pairs at depth 2 (the preset's promise, at gamma 0.8)
    assert table["0.9,2"]["seen_accuracy"] >= 0.9
