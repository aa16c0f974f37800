"""Memory is checked before it is spent (models/memory.py): sizes that cannot fit are exit 2
naming the setting, before anything is written; the estimate is near the measured peak."""

import pytest

from analyses.cli import main
from models.memory import SKIP_ENV, check_memory, memory_available
from models.presets import get_preset
from tasks import ConfigError, make_task


@pytest.mark.parametrize("setting, named", [
    ("model.d_model=1000000", "Lower the model's sizes"),
    ("train.batch_size=100000000", "Lower train.batch_size"),
    ("train.eval_size=100000000", "Lower train.eval_size"),
])
def test_a_run_too_large_for_memory_is_exit_2_naming_the_setting_before_anything_is_written(tmp_path, capsys,
                                                                                             setting, named):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), "--no-progress", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert named in err and "B of memory at its peak" in err and SKIP_ENV in err and "Traceback" not in err
    assert not out.exists()


def test_a_sweep_too_large_for_memory_is_refused_before_its_folder_is_made(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0,1", "--out", str(out), "--no-progress",
                 "--set", "train.batch_size=100000000"])
    assert code == 2 and "Lower train.batch_size" in capsys.readouterr().err
    assert not out.exists()


def test_the_check_counts_cells_trained_at_once_and_can_be_turned_off(monkeypatch):
    import torch

    available, _ = memory_available()
    cfg = get_preset("composite-cpu")
    task = make_task(cfg.task)
    estimate = check_memory(cfg, task, torch.device("cpu"))
    copies = available // estimate.total + 1  # one cell fits, this many at once do not
    with pytest.raises(ConfigError, match=f"for {copies} cells at once"):
        check_memory(cfg, task, torch.device("cpu"), copies=copies)
    monkeypatch.setenv(SKIP_ENV, "1")
    check_memory(cfg, task, torch.device("cpu"), copies=copies)


def test_an_analysis_too_large_for_memory_is_exit_2_naming_samples(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(run), "--no-progress", "--set", "train.steps=2",
                 "--set", "train.eval_every=2", "--set", "train.eval_size=64"]) == 0
    assert main(["analyze", str(run), "--samples", "100000000"]) == 2
    assert "Lower analyze --samples," in capsys.readouterr().err
    assert not (run / "analysis.json").exists()


@pytest.mark.slow  # five fresh processes that each train two steps of a large shape: 1-2 min
def test_the_estimate_is_within_a_factor_of_2_of_the_measured_peak():
    from analyses.research.memory_table import table

    rows = table()
    assert len(rows) >= 4
    for name, estimate, measured in rows:
        assert measured / 2 <= estimate <= 2 * measured, (name, estimate, measured)
