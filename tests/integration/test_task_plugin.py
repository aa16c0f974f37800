"""A task is a plugin: the toy modular-sum task is two files, tasks/modsum.py (data) and
interp/tasks/modsum.py (analysis, default preset), and one line in each room's list of tasks
(tasks/__init__.py; interp/tasks/__init__.py, its import and its entry), named nowhere else; and `workbench train`,
`analyze` and `report` take it like any built-in task, and so does a sweep's page."""

import json
import os
from pathlib import Path

from analyses.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOY = "modsum"
TOY_FILES = {Path("tasks") / f"{TOY}.py", Path("interp") / "tasks" / f"{TOY}.py"}
# the lists of tasks, and how many of their lines name it (interp/tasks/: its import and its ANALYSES entry)
TASK_LISTS = {Path("tasks") / "__init__.py": 1, Path("interp") / "tasks" / "__init__.py": 2}
TINY = ["--set", "train.steps=12", "--set", "train.batch_size=16", "--set", "train.eval_every=6",
        "--set", "train.eval_size=64", "--set", "train.warmup_steps=2", "--no-progress"]


def test_a_task_of_its_own_files_trains_analyses_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", TOY, "--out", str(out), *TINY]) == 0
    assert main(["analyze", str(out), "--samples", "32"]) == 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["task"] == TOY and analysis["probes"] is None
    assert set(analysis["verdict"]) == {"verdict", "accuracy", "chance"}
    assert set(analysis["patching"]) >= {"residual", "heads", "heads_attribution", "paths"}
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert f"&quot;name&quot;: &quot;{TOY}&quot;" in page or f'"name": "{TOY}"' in page  # the configuration
    assert "<h2>Verdict</h2>" in page and "Test accuracy on fresh sums" in page  # its own sections


def test_a_sweep_of_a_task_without_a_summary_of_its_own_shows_its_headline_metric(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", f"{TOY}-cpu", "--grid", "train.seed=0,1", "--out", str(out), "--workers", "1",
                 *TINY]) == 0
    page = json.loads((out / "sweep_page.json").read_text())
    assert page["axes"]["x"] is None and len(page["groups"]) == 1  # seeds only: one square
    square = page["groups"][0]
    assert (square["label"], square["k"], square["n"]) == ("-", 2, 2) and list(square["rates"]) == ["acc"]


def test_a_task_with_no_timeline_code_gets_a_timeline_from_its_verdict(tmp_path, capsys):
    """`analyze --timeline` reads every number of the toy task's verdict and its `verdict` field."""
    out = tmp_path / "run"
    assert main(["train", "--task", TOY, "--out", str(out), "--set", "train.snapshots=4", *TINY]) == 0
    assert main(["analyze", str(out), "--timeline", "--no-progress"]) == 0
    timeline = json.loads((out / "timeline.json").read_text())
    first, last = timeline["points"][0], timeline["points"][-1]
    assert first["step"] == 0 and last["step"] == 12 and last["reasons"] == ["final weights"]
    assert set(first["panels"]) == {"evidence"} and set(first["panels"]["evidence"]) == {"accuracy", "chance"}
    assert first["label"] == "unlearned" and timeline["summary"]["final_label"] == last["label"]
    assert "Timeline: the solution through training" in (out / "report.html").read_text()


def test_an_unknown_task_is_exit_2_naming_the_registered_ones(tmp_path, capsys):
    assert main(["train", "--task", "chess", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--task 'chess' is unknown" in err and all(name in err for name in ("lego", "composite", "templates", TOY))
    assert not (tmp_path / "run").exists()


def test_no_other_python_file_names_the_toy_task():
    """Adding the task touched its two files and the lists of tasks, nothing else."""
    this = Path(__file__).resolve()
    naming, lines = [], {}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"
                         and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            text = path.read_text(errors="replace") if name.endswith(".py") else ""
            if path.resolve() != this and TOY in text:
                naming.append(path.relative_to(ROOT))
                lines[path.relative_to(ROOT)] = sum(TOY in line for line in text.splitlines())
    assert set(naming) == TOY_FILES | set(TASK_LISTS), f"files naming {TOY!r}: {sorted(map(str, naming))}"
    assert {path: lines[path] for path in TASK_LISTS} == TASK_LISTS
