"""The sweep's page: `workbench report SWEEP` writes report.html and sweep_page.json of a tiny
composite sweep (2 init scales x 2 depths), of the same sweep caught in progress, and of one with
damaged cells (exit 2 naming the file, page written, runs untouched); bad folders are exit 2."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from analyses.cli import main
from models.safe_files import run_lock

TINY = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=12",
        "--set", "train.batch_size=16", "--set", "train.eval_every=6", "--set", "train.eval_size=64",
        "--set", "train.warmup_steps=2", "--set", "train.checkpoint_every=6", "--set", "train.snapshots=0",
        "--no-progress"]
CELLS = [f"init_gamma={g}__n_layers={d}__seed=0" for g in (0.3, 0.5) for d in (1, 2)]


@pytest.fixture(scope="module")
def trained_sweep(tmp_path_factory) -> Path:
    """A finished tiny composite sweep: model.init_gamma 0.3, 0.5 x model.n_layers 1, 2, seed 0."""
    out = tmp_path_factory.mktemp("sweeps") / "phase"
    assert main(["sweep", "--preset", "composite-cpu", "--grid", "model.init_gamma=0.3,0.5", "model.n_layers=1,2",
                 "train.seed=0", "--out", str(out), "--workers", "1", *TINY]) == 0
    return out


@pytest.fixture
def sweep(trained_sweep, tmp_path) -> Path:
    """A copy of the trained sweep, without its page, to change at will."""
    copy = Path(shutil.copytree(trained_sweep, tmp_path / "phase"))
    (copy / "report.html").unlink()
    (copy / "sweep_page.json").unlink()
    return copy


def _page(folder: Path) -> dict:
    return json.loads((folder / "sweep_page.json").read_text())


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_sweep_writes_its_page_and_report_writes_it_again(trained_sweep, sweep, capsys):
    assert (trained_sweep / "sweep_page.json").is_file() and (trained_sweep / "sweep_plan.json").is_file()
    assert main(["report", str(sweep)]) == 0
    assert "4 cells: 4 done" in capsys.readouterr().out
    page = _page(sweep)
    assert _page(trained_sweep)["cells"] == page["cells"]  # the sweep's own page is the same
    cell = page["cells"][CELLS[0]]
    assert cell["status"] == "done" and cell["source"] == "metrics.jsonl" and cell["step"] == 12
    # 12 steps learn nothing: the task's own summary of the last record says so, with its rates (64 evaluation
    # sequences hold no held-out pair, so seen accuracy alone)
    assert cell["label"] == "unlearned" and set(cell["rates"]) == {"seen"}
    assert cell["report"] == {"href": f"{CELLS[0]}/report.html", "exists": False} and cell["timeline"] is None
    text = (sweep / "report.html").read_text()
    assert "data:image/png;base64," in text and "acc_seen" in text
    assert f"workbench analyze {sweep / CELLS[0]}" in text and f"workbench analyze {sweep}</code>" in text


def _links(page: Path) -> list[str]:
    """The page's links to files (not anchors, not the web), as written."""
    hrefs = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', page.read_text())]
    return [h for h in hrefs if not h.startswith(("#", "http:", "https:", "data:"))]


def test_analyze_sweep_analyses_every_finished_cell_once_and_links_them_from_the_page(sweep, capsys):
    assert main(["analyze", str(sweep), "--samples", "64", "--no-progress"]) == 0
    assert "analysed 4 cell(s) (0 already analysed, 0 not finished)" in capsys.readouterr().out
    assert all((sweep / name / "analysis.json").is_file() and (sweep / name / "report.html").is_file()
               for name in CELLS)
    page = _page(sweep)
    assert {c["source"] for c in page["cells"].values()} == {"analysis.json"}
    links = _links(sweep / "report.html")
    for name in CELLS:  # each cell's folder and report, by paths relative to the page's folder
        assert f"{quote(name, safe='=,')}/" in links and f"{quote(name, safe='=,')}/report.html" in links
    assert links and all(not Path(link).is_absolute() and (sweep / unquote(link)).exists() for link in links)
    assert "workbench analyze" not in (sweep / "report.html").read_text()  # nothing left to run
    analysed = {name: (sweep / name / "analysis.json").stat().st_mtime_ns for name in CELLS}
    assert main(["analyze", str(sweep), "--no-progress"]) == 0  # a rerun skips the cells analysed
    assert "analysed 0 cell(s) (4 already analysed" in capsys.readouterr().out
    assert analysed == {name: (sweep / name / "analysis.json").stat().st_mtime_ns for name in CELLS}


def test_a_2x2_composite_grid_is_a_2x2_figure_with_one_seed_per_square(sweep):
    assert main(["report", str(sweep)]) == 0
    page = _page(sweep)
    assert page["axes"] == {"x": "model.init_gamma", "y": "model.n_layers", "facets": [], "seed": "train.seed"}
    squares = {(g["x"], g["y"]): g for g in page["groups"]}
    assert set(squares) == {(0.3, 1), (0.3, 2), (0.5, 1), (0.5, 2)}
    assert squares[(0.5, 2)]["runs"] == ["init_gamma=0.5__n_layers=2__seed=0"]
    assert all(g["k"] == 1 and g["n"] == 1 and g["label"] == "unlearned" for g in page["groups"])


def test_a_verdict_comes_from_the_timeline_before_the_metrics_and_the_cell_links_it(sweep):
    run = sweep / CELLS[1]
    verdict = {"verdict": "symmetric", "seen_accuracy": 1.0, "held_out_inferential": 0.1, "held_out_symmetric": 0.85,
               "held_out_other": 0.05}
    point = {"step": 12, "reasons": ["final weights"], "label": "symmetric", "panels": {}, "head_labels": [["mixed"]],
             "head_patching": None, "circuit": [], "verdict": verdict}
    (run / "timeline.json").write_text(json.dumps({
        "schema": 1, "run": str(run), "task": "composite", "points": [point],
        "summary": {"final_label": "symmetric", "decided_at": 6, "changes": [], "crossings": {}, "heads": {}}}))
    assert main(["report", str(sweep)]) == 0
    cell = _page(sweep)["cells"][CELLS[1]]
    assert (cell["label"], cell["source"]) == ("symmetric", "timeline.json")
    assert cell["rates"] == {"seen": 1.0, "x-10": 0.1, "x-6": 0.85}
    assert cell["timeline"]["decided_at"] == 6 and cell["timeline"]["href"] == f"{CELLS[1]}/timeline.json"
    assert "decided at step 6" in (sweep / "report.html").read_text()


def test_a_sweep_in_progress_shows_pending_partial_and_running_cells(sweep, capsys):
    (sweep / "sweep.json").unlink()  # what a sweep that has not finished (or was killed) leaves
    shutil.rmtree(sweep / CELLS[0])  # not started
    metrics = sweep / CELLS[1] / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")  # stopped after its first evaluation
    (sweep / "cells.json").write_text(json.dumps({name: v for name, v in json.loads((sweep / "cells.json").read_text())
                                                  .items() if name not in CELLS[:3]}))
    with run_lock(sweep / CELLS[2]):  # being trained
        assert main(["report", str(sweep)]) == 0
    page = _page(sweep)
    assert not page["finished"]
    statuses = {n: c["status"] for n, c in page["cells"].items()}
    assert statuses == dict(zip(CELLS, ["pending", "partial", "running", "done"]))
    assert page["cells"][CELLS[0]]["label"] is None
    square = next(g for g in page["groups"] if g["runs"] == [CELLS[1]])
    assert square["label"] == "unlearned" and square["provisional"]
    assert "1 pending" in (sweep / "report.html").read_text()


def test_a_damaged_cell_is_exit_2_naming_it_and_the_page_is_still_written(sweep, capsys):
    (sweep / CELLS[0] / "config.json").write_text("{not json")
    metrics = sweep / CELLS[3] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(["{broken", *lines[1:]]) + "\n")
    runs = {name: _files(sweep / name) for name in CELLS}
    assert main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert str(sweep / CELLS[0] / "config.json") in err and "1 more damaged" in err
    page = _page(sweep)
    assert [d["cell"] for d in page["damaged"]] == [CELLS[0], CELLS[3]]
    assert str(metrics) in page["cells"][CELLS[3]]["error"]
    assert page["cells"][CELLS[1]]["status"] == "done"  # the others are shown as ever
    assert "Damaged and failed cells" in (sweep / "report.html").read_text()
    assert {name: _files(sweep / name) for name in CELLS} == runs  # nothing written into the runs


def test_a_folder_that_is_neither_run_nor_sweep_and_a_damaged_sweep_json_are_exit_2(sweep, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "neither a run folder" in capsys.readouterr().err
    (sweep / "sweep.json").write_text('{"grid": {"model.init_gamma": [0.3]}}')
    assert main(["report", str(sweep)]) == 2
    assert str(sweep / "sweep.json") in capsys.readouterr().err
    assert not (sweep / "report.html").exists() and not (sweep / "sweep_page.json").exists()


def test_a_lego_sweep_shows_accuracy_per_variable_by_model(tmp_path):
    out = tmp_path / "lego"
    assert main(["sweep", "--preset", "lego-cpu", "--grid", "model.tie_layers=false,true", "--out", str(out),
                 "--workers", "1", *TINY]) == 0
    page = _page(out)
    assert page["axes"] == {"x": "model.tie_layers", "y": None, "facets": [], "seed": None}
    n_vars = json.loads((out / "sweep.json").read_text())["base"]["task"]["n_vars"]
    for cell in page["cells"].values():
        assert cell["source"] == "metrics.jsonl" and list(cell["rates"]) == [f"#{i}" for i in range(n_vars)]
        assert cell["label"].endswith("learned")  # lego_verdict_label: "none learned", "#0-#2 learned" ...
    assert "Rates per run" in (out / "report.html").read_text()

