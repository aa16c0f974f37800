"""LEGO at cpu scale (`make test-slow`), bounded to about an hour and a half on two cores:

- the recipe the cpu studies' learned models come from: the `lego-three-hops` curriculum must
  fit #0-#4 of n = 8 (three association hops) within 60 minutes on two cores, nothing planted;
- the ground-truth experiments (mimicking, hardcoded heads), which keep the `lego-cpu` recipe,
  each within 30 minutes.

The studies of learned models (extrapolation, percolation, stochastic depth, heads, shortcut,
S3) train several curricula each, up to about two hours on two cores; they are not repeated
here. Their code runs end to end at tiny scale (tests/integration/test_lego_study.py); the zoo
(tests/integration/test_zoo.py) checks what RESULTS.md reports of learned curriculum models."""

import time

import pytest
import torch

from analyses.runners.study import run_study
from interp.tasks.lego_presets import LEGO_THREE_HOPS
from models.curriculum import train_curriculum
from models.device import bf16_supported

pytestmark = pytest.mark.slow


def test_the_three_hop_curriculum_fits_five_variables_of_eight_within_an_hour_on_two_cores(tmp_path):
    if not bf16_supported(torch.device("cpu")):
        pytest.skip("the curriculum trains in bf16; this CPU has no bf16 kernels")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = train_curriculum(LEGO_THREE_HOPS, tmp_path, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert sum(r.seconds for r in results) < 3600
    acc = results[-1].final["acc_per_var"]
    assert len(acc) == 8 and min(acc[:5]) >= 0.98, acc


@pytest.mark.parametrize("name", ["lego-mimic", "lego-hardcoded"])
def test_each_ground_truth_experiment_finishes_within_30_minutes_on_two_cores(tmp_path, name):
    started = time.perf_counter()
    results = run_study(name, tmp_path / name, "cpu", workers=2, progress=False)
    assert time.perf_counter() - started < 1800
    assert (tmp_path / name / "report.html").exists() and results["headline"]
