"""Grids: parsing `--grid` values, naming and validating the cells of a sweep."""

import pytest

from analyses.runners.sweep import (
    cell_name,
    check_cell_folder,
    grid_cells,
    grid_points,
    parse_grid,
    run_cells,
    threads_per_worker,
)
from tasks import ConfigError
from tests.helpers import tiny_composite_run


def test_parse_grid_reads_json_values_and_keeps_strings():
    grid = parse_grid(["model.init_gamma=0.3,0.5", "train.seed=0,1,2", "model.act_fn=gelu,relu",
                       "train.grad_clip=null,1"])
    assert grid == {"model.init_gamma": [0.3, 0.5], "train.seed": [0, 1, 2], "model.act_fn": ["gelu", "relu"],
                    "train.grad_clip": [None, 1]}


@pytest.mark.parametrize("item", ["init_gamma=0.3", "model.init_gamma", "model.init_gamma="])
def test_parse_grid_rejects_malformed_items(item):
    with pytest.raises(ConfigError, match="section.key=v1,v2"):
        parse_grid([item])


def test_parse_grid_rejects_a_key_given_twice():
    with pytest.raises(ConfigError, match="twice"):
        parse_grid(["train.seed=0", "train.seed=1"])


def test_grid_cells_are_every_combination_first_key_slowest():
    grid = {"model.init_gamma": [0.3, 0.5], "model.n_layers": [2, 3], "train.seed": [0]}
    cells = grid_cells(tiny_composite_run(), grid)
    assert list(cells) == ["init_gamma=0.3__n_layers=2__seed=0", "init_gamma=0.3__n_layers=3__seed=0",
                           "init_gamma=0.5__n_layers=2__seed=0", "init_gamma=0.5__n_layers=3__seed=0"]
    cfg = cells["init_gamma=0.5__n_layers=3__seed=0"]
    assert (cfg.model.init_gamma, cfg.model.n_layers, cfg.train.seed) == (0.5, 3, 0)
    assert cfg.model.d_model == tiny_composite_run().model.d_model  # the rest is the base's
    assert len(grid_points(grid)) == 4 and cell_name({"train.lr": 0.001}) == "lr=0.001"


def test_grid_cells_validate_each_config():
    with pytest.raises(ConfigError, match="init_gamma=-1"):
        grid_cells(tiny_composite_run(), {"model.init_gamma": [0.5, -1]})
    with pytest.raises(ConfigError, match="no field"):
        grid_cells(tiny_composite_run(), {"model.gamma": [0.5]})


def test_grid_keys_whose_folder_names_would_collide_are_refused():
    with pytest.raises(ConfigError, match="collide"):
        grid_cells(tiny_composite_run(), {"model.n_ctx": [9], "task.n_ctx": [9]})


@pytest.mark.parametrize("value", ["../../x", "/abs/x", "a\\b", "..", "%2F"])
def test_a_grid_value_names_one_folder_inside_the_sweep(value, tmp_path):
    name = cell_name({"train.init_from": value})
    assert "/" not in name and "\\" not in name
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    assert cell_name({"train.init_from": "a/b"}) != cell_name({"train.init_from": "a%2Fb"})  # one-to-one


def test_a_cell_name_too_long_for_the_file_system_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="folder name of 3.. bytes"):
        grid_cells(tiny_composite_run(), {"train.init_from": ["r" * 300]})
    with pytest.raises(ConfigError, match="not one folder name"):
        check_cell_folder(tmp_path, "a/../../b")


def test_workers_share_the_cores(monkeypatch):
    monkeypatch.setenv("WORKBENCH_THREADS", "8")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert [threads_per_worker(w) for w in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    monkeypatch.setenv("WORKBENCH_THREADS", "1")  # a cpu-slot grants one core
    assert threads_per_worker(1) == 1


def test_run_cells_refuses_unknown_backends_and_stray_addresses(tmp_path):
    with pytest.raises(ConfigError, match="backend 'dask'"):
        run_cells({}, tmp_path, backend="dask")
    with pytest.raises(ConfigError, match="only applies to --backend ray"):
        run_cells({}, tmp_path, address="ray://head:10001")


def test_a_cell_whose_folder_another_process_writes_is_waited_for_then_failed_not_refused(tmp_path, monkeypatch):
    """A worker of a killed sweep still dying holds its cell's lock for a moment: the cell waits,
    and if the folder stays busy it is `failed` (a re-run retries it), never `refused` (exit 2)."""
    import subprocess
    import sys

    import analyses.runners.cell as cells

    monkeypatch.setattr(cells, "LOCK_GRACE_S", 0.3)
    cell = tmp_path / "seed=0"
    cell.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('held', flush=True); time.sleep(30)", str(cell / ".workbench.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        result = cells.train_cell("seed=0", tiny_composite_run().to_dict(), str(cell))
    finally:
        holder.kill()
        holder.wait()
    assert (result.status, result.refused) == ("failed", False)
    assert "being written by another process" in result.error and "re-run the sweep" in result.error
