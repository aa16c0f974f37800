"""The hostile table (issue 30, item 8): every command against every kind of damage its run
folder can suffer, as one generated table of (command, damaged file, kind of damage) rows.

Each row copies a tiny trained run (built once per module), damages one file of the copy, runs
the command in-process (`main([...])`) and asserts
- the exit status: 2 for a damaged or ambiguous input (and then nothing at all is written), 4
  for a write that fails (disk full, permission denied), 0 only where the command legitimately
  repairs (a writer rewrites damaged weights from a valid train state, with a warning naming the
  file) or legitimately does not need what is damaged;
- a one-line message on stderr naming the file or the problem, and no traceback;
- that nothing the user owned changed: files outside the command's folder (a symbolic link's
  target above all), and for the read-only commands (analyze, report, zoo list, benchmark) the
  folder's files other than analysis.json and report.html.

Issue 43 added generated rows for special files (a FIFO, a link to /dev/zero, a socket) in place
of every run file and the lock, files larger than their kind can hold (sparse), numbers too long
or too large in config.json and metrics.jsonl, names longer than the file system takes, a killed
writer's temporary files left beside the run's, and weights that are NaN. Every row runs under a
SIGALRM guard (`no_hang`), so a command that blocks on a FIFO fails its row instead of hanging the
suite.

Issue 54 added rows for a subfolder that links to another run's (`snapshots/`, `states/`), a
metrics record without a metric, NaN weights, and a second table, `INPUTS`, of what is not a
damaged run file: settings and files that ask for too much (`train.snapshots`, a MIB cfg of a
million layers, a MIB file past 64 MiB), text that would reach a renderer as markup (a grid value
with `$`, a findings page with a `javascript:` link, an image from outside its figures, an open
code fence), outputs that cannot be taken, and a lock another program holds.

Rows where the product does the wrong thing are kept and marked xfail(strict=True) with what it
does wrong; they pass (as xfails) until the product is fixed, then fail as XPASS so the mark
comes off. How a row damages a file, makes a write fail and snapshots what the user owns is
`hostile_damage.py`'s, beside this file."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import warnings
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest

import interp.circuit_compare
import models.curriculum
import models.runs
import models.safe_files
from analyses.cli import main
from analyses.findings.__main__ import main as findings_main
from analyses.studies.lego_pool import TINY_CURRICULUM
from analyses.zoo import ZOO_DIR
from models.curriculum import train_curriculum
from models.runs import (
    ANALYSIS,
    CONFIG,
    ERROR_LOG,
    LOCK,
    METRICS,
    REPORT,
    SNAPSHOTS,
    STATES,
    TRAIN_STATE,
    WEIGHTS,
    read_config,
    verified_weights,
)
from models.safe_files import is_own_temp
from tests.helpers import kill_at, no_hang
from tests.integration.hostile_damage import (
    DEAD_PID,
    NOTES,
    damage,
    fail_safetensors,
    fail_writes,
    read_only,
    snapshot,
    under,
)

TINY = ["--set", "model.d_model=32", "--set", "model.d_mlp=64", "--set", "train.steps=20",
        "--set", "train.eval_every=5", "--set", "train.checkpoint_every=10", "--set", "train.eval_size=64",
        "--no-progress"]
FOREIGN_LOCK = b"someone else's file\n"
ZOO_ENTRY = "composite-symmetric"
SWEEP_CELL = "seed=0"  # the one cell of `--grid train.seed=0`, the base run's own config

SAFETENSORS_DAMAGE = ["deleted", "truncated", "flip-data", "flip-header", "symlink", "directory"]
JSON_DAMAGE = ["deleted", "truncated", "bitflip", "symlink", "directory", "dup-key", "deep"]
READ_ONLY_COMMANDS = {"analyze", "timeline", "report", "zoo", "benchmark"}
SNAPSHOT_INDEX, FIRST_SNAPSHOT = "snapshots/index.json", "snapshots/step-0000000.safetensors"  # the base run keeps both
# issue 43: special files, sizes beyond a kind's limit, numbers beyond a value's, a killed writer's temp files
SPECIAL_FILES = ["fifo", "devzero", "socket"]
RUN_FILES_AND_LOCK = [CONFIG, METRICS, WEIGHTS, TRAIN_STATE, LOCK]
# commands that lock the run folder (a finished one too)
LOCKERS = {"resume", "resume-partial", "analyze", "report", "sweep"}


@dataclass(frozen=True)
class Row:
    command: str  # train | resume | resume-partial | analyze | timeline | report | sweep | curriculum | zoo | benchmark
    file: str  # the damaged path, relative to the command's folder ("" for the folder itself)
    damage: str
    status: int
    named: tuple[str, ...]  # what the message must hold; {file}: the damaged path, {folder}: the folder holding it

    @property
    def id(self) -> str:
        return f"{self.command}:{self.file or 'folder'}:{self.damage}"


# ------------------------------------------------------------------------------------------------
# the table, generated: which damages each command meets, and what it must do about each


def _expected(command: str, name: str, damage: str) -> tuple[int, tuple[str, ...]]:
    """Status and message of `command` on a folder whose run file `name` has `damage`."""
    writer = command in ("resume", "resume-partial", "sweep", "curriculum")
    if command == "train":  # a new run into a folder that holds a (damaged) run: refused, naming the folder
        return 2, ("{folder}",)
    if damage == "temp-left":  # a killed writer's temp file beside the run's: removed by the lock's taker, or ignored
        return 0, ()
    if name == LOCK and command not in LOCKERS:
        return 0, ()  # a reader that takes no lock does not open it for writing, and never blocks on it
    if name == WEIGHTS and damage != "directory" and writer:
        return 0, ("{file}",)  # rewritten from the valid train state, with a warning naming it
    if command == "zoo" and name == WEIGHTS:
        return 0, ("missing",) if damage == "deleted" else ("damaged",)  # the listing marks the entry
    if name == WEIGHTS and damage == "deleted" and command in ("resume", "analyze"):
        return (2, ("{folder}", WEIGHTS)) if command == "analyze" else (0, ("{file}",))
    if name == TRAIN_STATE and damage == "deleted":
        # a reader needs no train state (the zoo keeps none); resume restarts from step 0, warning
        return 0, (("{file}",) if writer else ())
    if name == METRICS and damage == "truncated" and command == "resume":
        return 2, ("{file}",)  # the records of steps 15 and 20 are lost: resuming the finished run cannot finish it
    if name == METRICS and damage == "truncated":
        return 0, ("{file}",)  # the damaged last line dropped, with a warning naming the file
    if name == METRICS and damage == "deleted" and not writer:
        return 0, ()  # metrics are optional to a reader
    if name == ANALYSIS and command == "analyze" and damage != "directory":
        return 0, ()  # analyze writes analysis.json anew, replacing (never following) what is there
    if name == ANALYSIS and command == "report" and damage == "deleted":
        return 0, ()  # a report without an analysis
    if name == CONFIG and damage == "deleted" and command == "resume":
        return 2, ("{folder}", CONFIG)
    return 2, ("{file}",)


# command -> (file -> damages it meets)
PLAN = {
    "train": {CONFIG: JSON_DAMAGE, WEIGHTS: ["deleted", "directory"]},
    "resume": {CONFIG: JSON_DAMAGE, WEIGHTS: SAFETENSORS_DAMAGE, TRAIN_STATE: [*SAFETENSORS_DAMAGE, "flip-weights"],
               METRICS: JSON_DAMAGE},
    "resume-partial": {TRAIN_STATE: ["flip-rng", "flip-weights"], WEIGHTS: ["flip-data"]},
    "analyze": {CONFIG: ["truncated", "dup-key", "deep"], WEIGHTS: SAFETENSORS_DAMAGE,
                TRAIN_STATE: ["truncated", "flip-header", "symlink", "directory"],
                METRICS: ["bitflip", "symlink", "directory", "dup-key"], ANALYSIS: ["symlink", "directory"]},
    "report": {CONFIG: ["bitflip", "symlink", "directory"], WEIGHTS: ["deleted", "flip-data", "flip-header"],
               TRAIN_STATE: ["flip-weights", "directory"], METRICS: ["truncated", "deep"], ANALYSIS: JSON_DAMAGE},
    "sweep": {CONFIG: ["dup-key"], WEIGHTS: ["flip-data", "symlink", "directory"], TRAIN_STATE: ["truncated"],
              METRICS: ["bitflip"]},
    "curriculum": {f"1/{CONFIG}": ["dup-key"], f"1/{WEIGHTS}": ["flip-data", "directory"],
                   f"2/{TRAIN_STATE}": ["truncated"]},
    "zoo": {CONFIG: ["deleted", "truncated", "directory", "dup-key", "deep"], WEIGHTS: SAFETENSORS_DAMAGE},
    "benchmark": {CONFIG: ["dup-key"], WEIGHTS: ["deleted", "flip-data"], TRAIN_STATE: ["truncated"],
                  METRICS: ["directory"]},
}
PREFIX = {"sweep": f"{SWEEP_CELL}/", "zoo": f"{ZOO_ENTRY}/"}  # where the run sits inside the command's folder

# rows that are not a damaged file: a foreign lock link, a read-only folder, a write that fails
SPECIAL = [
    *[Row(command, LOCK, "symlink-foreign", 2, ("{file}",))
      for command in ("train", "resume", "analyze", "report", "sweep")],
    *[Row(command, "", "read-only", 4, ("{folder}", "Permission denied"))
      for command in ("train", "resume", "analyze", "report", "sweep")],
    Row("zoo", "", "read-only", 0, ()),  # a listing writes nothing
    Row("curriculum", "1", "read-only+weights-deleted", 4, ("{folder}", "Permission denied")),
    Row("train", WEIGHTS, "ENOSPC", 4, ("{file}", "No space left on device")),
    Row("train", WEIGHTS, "ENOSPC-safetensors", 4, ("{file}", "No space left on device")),
    Row("train", METRICS, "ENOSPC-append", 4, ("{file}", "No space left on device")),
    Row("resume", WEIGHTS, "deleted+ENOSPC", 4, ("{file}", "No space left on device")),
    Row("resume", WEIGHTS, "deleted+EACCES-safetensors", 4, ("{file}", "Permission denied")),
    Row("resume", METRICS, "ENOSPC-rewrite", 4, ("{file}", "No space left on device")),
    Row("analyze", ANALYSIS, "ENOSPC", 4, ("{file}", "No space left on device")),
    Row("report", REPORT, "ENOSPC", 4, ("{file}", "No space left on device")),
    Row("report", REPORT, "symlink", 0, ()),  # report.html is written anew, never through the link
]

# issue 43's rows, generated: every command against each class of damage
ALL_COMMANDS = ["train", "resume", "analyze", "report", "sweep", "zoo", "benchmark"]
# own lists
PLAN = {command: {name: list(damages) for name, damages in files.items()} for command, files in PLAN.items()}
for command in ALL_COMMANDS:
    files = PLAN.setdefault(command, {})
    for name in ([CONFIG, WEIGHTS] if command == "zoo" else RUN_FILES_AND_LOCK):
        files.setdefault(name, []).extend(["fifo", "devzero"] if command in ("train", "zoo", "benchmark")
                                          else SPECIAL_FILES)
    for name in ([CONFIG, WEIGHTS] if command == "zoo" else [CONFIG, METRICS, WEIGHTS, TRAIN_STATE]):
        files.setdefault(name, []).append("huge")
    files.setdefault(CONFIG, []).extend(["long-int", "float-overflow"])
    if command != "zoo":
        files.setdefault(METRICS, []).append("long-int")
    files.setdefault(CONFIG if command == "zoo" else WEIGHTS, []).append("temp-left")
for name in (f"1/{CONFIG}", f"1/{WEIGHTS}", f"2/{TRAIN_STATE}", f"2/{LOCK}"):
    PLAN["curriculum"].setdefault(name, []).extend(["fifo", "devzero"])
PLAN["resume-partial"].update({METRICS: ["fifo", "huge", "temp-left"],
                               TRAIN_STATE: ["flip-rng", "flip-weights", "fifo", "devzero"]})
for command in ("analyze", "report"):
    PLAN[command].setdefault(ANALYSIS, []).append("temp-left")

ROWS = [Row(command, PREFIX.get(command, "") + name, damage, *_expected(command, Path(name).name, damage))
        for command, files in PLAN.items() for name, damages in files.items() for damage in damages] + SPECIAL
ROWS += [Row(command, "", "long-name", 2, ("255 bytes",)) for command in [*ALL_COMMANDS, "curriculum"]]
# issue 40's rows: `analyze --timeline` reads every snapshot through its index, so a damaged index or
# snapshot is exit 2 naming it and nothing is written; a deleted index is a run without snapshots
ROWS += [Row("timeline", SNAPSHOT_INDEX, kind, 2, ("{folder}",) if kind == "deleted" else ("{file}",))
         for kind in [*JSON_DAMAGE, "fifo", "devzero", "huge"]]
ROWS += [Row("timeline", FIRST_SNAPSHOT, kind, 2, ("{file}",)) for kind in [*SAFETENSORS_DAMAGE, "fifo", "devzero"]]
# issue 54: a metric a record lacks is missing, not a crash; a subfolder that is a link to another
# run's (its snapshots/) is refused by every trainer
ROWS += [Row(command, METRICS, "no-train-loss", 0, ()) for command in ("analyze", "report")]
ROWS += [Row(command, SNAPSHOTS, "symlink-folder", 2, ("{file}", "symbolic link"))
         for command in ("resume", "resume-partial")]
ROWS += [Row("resume-partial", STATES, "symlink-folder", 2, ("{file}", "symbolic link")),  # any subfolder
         # a finished cell is skipped: nothing is written, through the link or beside it
         Row("sweep", f"{SWEEP_CELL}/{SNAPSHOTS}", "symlink-folder", 0, ())]
ROWS += [Row("train", f".{CONFIG}.{DEAD_PID}.0badf00d.tmp", "temp-only", 0, ()),  # a train killed writing its config
         Row("analyze", WEIGHTS, "nan", 0, ()), Row("report", WEIGHTS, "nan", 0, ())]

# what the product does wrong, by row id (reproduced on this checkout; see the final report)
XFAIL: dict[str, str] = {  # row id -> what the product does wrong there (none left)
}


def _param(row: Row):
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[row.id])] if row.id in XFAIL else []
    return pytest.param(row, id=row.id, marks=marks)


@pytest.mark.parametrize("count", [len(ROWS)], ids=[f"{len(ROWS)}-rows"])
def test_the_hostile_table_has_at_least_40_rows(count):
    print(f"the hostile table has {count} rows ({len(XFAIL)} marked xfail)")
    assert count >= 40
    assert len({row.id for row in ROWS}) == count  # no row counted twice
    assert set(XFAIL) <= {row.id for row in ROWS}  # no stale xfail entry


# ------------------------------------------------------------------------------------------------
# the tiny trained folders, built once per session (test_resume_cut reads them too) and copied per row


@pytest.fixture(scope="module")
def base_run(built_once) -> Path:
    """A finished tiny composite run (20 steps, 4 evaluations, checkpoints at 10 and 20) with its
    analysis.json and report.html."""
    def build(folder: Path) -> Path:
        out = folder / "run"
        assert main(["train", "--preset", "composite-cpu", "--out", str(out), *TINY]) == 0
        assert main(["analyze", str(out), "--samples", "8"]) == 0
        return out

    return built_once("hostile-base-run", build)


@pytest.fixture(scope="module")
def partial_run(built_once, base_run) -> Path:
    """The base run's config killed in step 16: train state of step 10, metrics to step 15."""
    def build(folder: Path) -> Path:
        kill_at(read_config(base_run), folder / "run", 15)
        return folder / "run"

    return built_once("hostile-partial-run", build)


@pytest.fixture(scope="module")
def base_course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("course") / "course"
    train_curriculum(TINY_CURRICULUM, out, progress=False)
    return out


def _copy_course(source: Path, target: Path) -> None:
    """A copy of a trained curriculum, its stage 2 re-pointed at the copy's stage 1 (config.json
    and init.json name where stage 1 was trained)."""
    shutil.copytree(source, target, symlinks=True)
    for name in (CONFIG, "init.json"):
        path = target / "2" / name
        path.write_text(path.read_text().replace(str(source), str(target)))


# ------------------------------------------------------------------------------------------------
# the table


def _setup(row: Row, tmp: Path, request) -> tuple[Path, list[str]]:
    """The command's folder (a copy of a trained one) and its command line."""
    command = row.command
    if command == "zoo":
        root = tmp / "zoo"
        shutil.copytree(ZOO_DIR / ZOO_ENTRY, root / ZOO_ENTRY)
        return root, ["zoo", "list", "--dir", str(root)]
    if command == "curriculum":
        root = tmp / "course"
        _copy_course(request.getfixturevalue("base_course"), root)
        request.getfixturevalue("monkeypatch").setitem(models.curriculum.CURRICULA, TINY_CURRICULUM.name,
                                                       TINY_CURRICULUM)
        return root, ["curriculum", TINY_CURRICULUM.name, "--out", str(root), "--no-progress"]
    if command == "sweep":
        root = tmp / "sweep"
        shutil.copytree(request.getfixturevalue("base_run"), root / SWEEP_CELL)
        return root, ["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0", "--out", str(root),
                      "--workers", "1", *TINY]
    root = tmp / "run"
    if command == "train" and (row.damage.startswith("ENOSPC") or row.file == LOCK and row.damage == "symlink-foreign"
                               or row.damage in ("read-only", "temp-only")):
        if not row.damage.startswith("ENOSPC"):
            root.mkdir()  # an empty folder (read-only, or holding a foreign lock link); ENOSPC: a new one
    else:
        shutil.copytree(request.getfixturevalue("partial_run" if command == "resume-partial" else "base_run"), root)
    return root, {
        "train": ["train", "--preset", "composite-cpu", "--out", str(root), *TINY],
        "resume": ["train", "--out", str(root), "--resume", "--no-progress"],
        "resume-partial": ["train", "--out", str(root), "--resume", "--no-progress"],
        "analyze": ["analyze", str(root), "--samples", "8"],
        "timeline": ["analyze", str(root), "--timeline", "--samples", "8", "--no-progress"],
        "report": ["report", str(root)],
        "benchmark": ["benchmark", "--patching", str(root), "--quick"],
    }[command]


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_hostile(row: Row, tmp_path, capsys, monkeypatch, request):
    outside = tmp_path / "outside"  # the user's files beside the folder
    outside.mkdir()
    (outside / "keep.txt").write_bytes(NOTES)
    root, argv = _setup(row, tmp_path, request)
    if row.damage == "long-name":  # the folder argument, one name in it longer than the file system takes
        argv = [arg.replace(str(root), str(root / ("x" * 300))) for arg in argv]
    path = root / row.file if row.file else root
    folder = path if row.damage.startswith("read-only") else path.parent
    capsys.readouterr()

    with contextlib.ExitStack() as stack:
        if row.damage == "symlink-foreign":
            (outside / "foreign.lock").write_bytes(FOREIGN_LOCK)
            path.symlink_to(outside / "foreign.lock")
        elif row.damage == "read-only":
            stack.enter_context(read_only(folder, monkeypatch))
        elif row.damage == "read-only+weights-deleted":
            (path / WEIGHTS).unlink()
            path = path / WEIGHTS
            stack.enter_context(read_only(folder, monkeypatch))
        elif row.damage in ("ENOSPC", "ENOSPC-rewrite"):
            fail_writes(monkeypatch, "save_tensors" if row.file == WEIGHTS else "atomic_write_bytes", path,
                        errno.ENOSPC)
        elif row.damage == "ENOSPC-append":
            fail_writes(monkeypatch, "append_line", path, errno.ENOSPC)
        elif row.damage == "ENOSPC-safetensors":
            fail_safetensors(monkeypatch, path, errno.ENOSPC)
        elif row.damage == "deleted+ENOSPC":
            path.unlink()
            fail_writes(monkeypatch, "save_tensors", path, errno.ENOSPC)
        elif row.damage == "deleted+EACCES-safetensors":
            path.unlink()
            fail_safetensors(monkeypatch, path, errno.EACCES)
        elif row.damage == "long-name":
            pass
        else:
            damage(path, row.damage, outside)
        before = snapshot(tmp_path)
        with warnings.catch_warnings(record=True) as caught, no_hang(120):
            warnings.simplefilter("always")
            code = main(argv)
    captured = capsys.readouterr()
    after = snapshot(tmp_path)
    said = [str(w.message) for w in caught]
    named = [part.format(file=path, folder=folder) for part in row.named]
    where = f"exit {code}\nstderr: {captured.err[-3000:]}\nwarnings: {said}"
    print(where)  # shown by pytest -rP

    assert code == row.status, where
    assert "Traceback" not in captured.err + captured.out, where
    assert not [name for name in after if Path(name).name == ERROR_LOG or name.startswith("workbench-error")], where
    if row.status != 0:  # one line, naming the file or the problem
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert len(lines) == 1, where
        assert all(part in lines[0] for part in named), f"the message does not name {named}: {where}"
    elif row.command == "zoo" and named:  # the listing marks the entry
        entry = next(line for line in captured.out.splitlines() if line.startswith(ZOO_ENTRY))
        assert all(part in entry for part in named), captured.out
    elif named:  # a repair, with a warning naming what it repaired
        assert any(all(part in text for part in named) for text in said + [captured.err]), where

    # nothing the user owned changed
    assert under(after, "outside", True) == under(before, "outside", True)
    if row.status == 2 and row.command == "sweep":  # refused cell: only the sweep's own records of it are written
        records = {"cells.json", "sweep.json", "sweep_plan.json", "report.html", "sweep_page.json"}
        assert {k: v for k, v in after.items() if Path(k).name not in records} == \
               {k: v for k, v in before.items() if Path(k).name not in records}
    elif row.status == 2:  # refused: nothing written at all
        assert after == before
    else:
        rel = os.path.relpath(root, tmp_path)
        assert under(after, rel, False) == under(before, rel, False)  # outside the command's folder
        if row.command in READ_ONLY_COMMANDS:  # analysis.json, report.html and a dead writer's temp files aside
            def kept(snap):
                return {k: v for k, v in under(snap, rel, True).items()
                        if Path(k).name not in (ANALYSIS, REPORT) and not is_own_temp(Path(k).name)}
            assert kept(after) == kept(before)
    _check_issue_43_row(row, root, path)


def _check_issue_43_row(row: Row, root: Path, path: Path) -> None:
    """What issue 43's rows promise beyond the exit status: a dead writer's temp files gone after
    a command that locks the folder, a run trained where only one was left, analysis.json strict
    JSON saying that the weights are NaN, and the report saying it too."""
    if row.damage == "temp-left" and row.command in LOCKERS:
        assert not [p.name for p in path.parent.iterdir() if is_own_temp(p.name)]
    if row.damage == "temp-only":
        assert not path.exists() and (root / WEIGHTS).is_file()
    if row.damage == "nan" and row.command == "analyze":
        def refuse(constant):
            raise AssertionError(f"analysis.json holds {constant}: not strict JSON")
        written = json.loads((root / ANALYSIS).read_text(), parse_constant=refuse)
        assert "weights hold NaN" in written["non_finite"]["statement"]
    if row.damage == "nan":
        assert "weights hold NaN" in (root / REPORT).read_text()
    if row.status == 0 and Path(row.file).name == WEIGHTS and row.command not in READ_ONLY_COMMANDS:
        verified_weights(path.parent)  # the repair left weights that are the train state's


# ------------------------------------------------------------------------------------------------
# the table's second part (issue 54): inputs that are not a damaged run file. A setting or a file
# that asks for too much, text that would reach a renderer as markup, an output that cannot be
# taken, a lock another program holds. Each row: how to set it up, the status, what the one-line
# message names ({tmp}: the row's folder), and the one folder the command may write (None:
# nothing at all is written).


def _mib(tmp: Path, cfg: dict | None = None, size: int = 0) -> Path:
    """A MIB circuit file with `cfg`, or a sparse file of `size` bytes."""
    path = tmp / "circuit.json"
    if size:
        with open(path, "wb") as f:
            f.truncate(size)
    else:
        path.write_text(json.dumps({"cfg": cfg, "nodes": {}, "edges": {}}))
    return path


def _page(tmp: Path, markdown: str) -> list[str]:
    (tmp / "page.md").write_text(markdown)
    return ["--figures", str(tmp / "figures"), "--out", str(tmp / "out"), "--page", str(tmp / "page.md")]


def _lock_held_by_another_program(tmp: Path, run: Path, request) -> list[str]:
    """This process holds the lock file's flock through its own descriptor, as another program
    would; the file still names a writer that has gone."""
    lock = run / LOCK
    lock.write_text(f"{DEAD_PID}\n")
    holder = open(lock)  # noqa: SIM115 (held until the row ends)
    fcntl.flock(holder, fcntl.LOCK_EX)
    request.addfinalizer(holder.close)
    return ["train", "--out", str(run), "--resume", "--no-progress"]


def _link_to(tmp: Path, name: str) -> Path:
    (tmp / "mine.txt").write_bytes(NOTES)
    if name != "mine.txt":
        (tmp / name).symlink_to(tmp / "mine.txt")
    return tmp / name


def _measured(*args, **kwargs):
    raise AssertionError("the circuit was measured before its input was checked")


NEW_RUN = ["train", "--preset", "composite-cpu", *TINY]
MILLION_LAYERS = {"n_layers": 1_000_000, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 8}
# id -> (argv from (tmp, a copy of the base run, request), status, named, the folder it may write)
INPUTS = {
    "train:snapshots=1e9": (lambda tmp, run, r: [*NEW_RUN, "--out", str(tmp / "new"), "--set",
                                                 "train.snapshots=1000000000"], 2, ("train.snapshots",), None),
    "train:snapshots=1e8": (lambda tmp, run, r: [*NEW_RUN, "--out", str(tmp / "new"), "--set",
                                                 "train.snapshots=100000000"], 2, ("train.snapshots",), None),
    "train:empty-preset": (lambda tmp, run, r: ["train", "--preset", "", "--out", str(tmp / "new"), "--no-progress"],
                           2, ("--preset",), None),
    "train:blank-preset": (lambda tmp, run, r: ["train", "--preset", " ", "--out", str(tmp / "new"), "--no-progress"],
                           2, ("--preset",), None),
    "resume:lock-held-by-another-program": (_lock_held_by_another_program, 2,
                                            ("pid unknown", f"names pid {DEAD_PID}, which is not running"), None),
    "circuit-compare:mib-cfg-a-million-layers": (lambda tmp, run, r: ["circuit-compare", str(_mib(tmp, MILLION_LAYERS)),
                                                                      str(_mib(tmp, MILLION_LAYERS))],
                                                 2, ("{tmp}/circuit.json", "n_layers=1000000"), None),
    "circuit-compare:mib-beyond-64-mib": (lambda tmp, run, r: ["circuit-compare", str(_mib(tmp, size=(64 << 20) + 1)),
                                                               str(tmp / "circuit.json")],
                                          2, ("{tmp}/circuit.json",), None),
    "circuit-compare:out-a-folder": (lambda tmp, run, r: ["circuit-compare", str(run), str(run), "--out", str(tmp)],
                                     2, ("--out",), None),
    "circuit-export:out-a-file": (lambda tmp, run, r: ["circuit-export", str(run), "--out",
                                                       str(_link_to(tmp, "mine.txt"))],
                                  2, ("--out {tmp}/mine.txt is a file",), None),
    "circuit-export:out-a-link-to-a-file": (lambda tmp, run, r: ["circuit-export", str(run), "--out",
                                                                 str(_link_to(tmp, "link"))],
                                            2, ("--out {tmp}/link is a file",), None),
    # the cell fails (no run at `$x^$`), the page is written with the value as text
    "sweep:grid-value-with-mathtext": (lambda tmp, run, r: ["sweep", "--preset", "composite-cpu", "--grid",
                                                            "train.init_from=$x^$", "--out", str(tmp / "sweep"),
                                                            "--workers", "1", *TINY],
                                       2, ('init_from="$x^$"', "$x^$ holds no run"), "sweep"),
    "findings:javascript-link": (lambda tmp, run, r: _page(tmp, "[x](javascript:alert(1))"), 2,
                                 ("{tmp}/page.md", "javascript:alert(1"), None),
    "findings:image-outside-its-figures": (lambda tmp, run, r: _page(tmp, "![x](/etc/hostname)"), 2,
                                           ("{tmp}/page.md", "/etc/hostname"), None),
    "findings:image-dev-zero": (lambda tmp, run, r: _page(tmp, "![x](/dev/zero)"), 2,
                                ("{tmp}/page.md", "/dev/zero"), None),
    "findings:unterminated-code-fence": (lambda tmp, run, r: _page(tmp, "text\n\n```python\nprint(1)\n"), 2,
                                         ("{tmp}/page.md: line 3 opens a code block",), None),
}


@pytest.mark.parametrize("case", list(INPUTS))
def test_hostile_input(case, base_run, tmp_path, capsys, monkeypatch, request):
    setup, status, named, writes = INPUTS[case]
    if case.startswith("circuit-"):  # every refusal comes before the measurement: reaching it fails the row
        monkeypatch.setattr(interp.circuit_compare, "measure_run_circuit", _measured)
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    argv = setup(tmp_path, run, request)
    command = findings_main if case.startswith("findings:") else main
    before = snapshot(tmp_path)
    capsys.readouterr()
    with warnings.catch_warnings(record=True), no_hang(120):
        warnings.simplefilter("always")
        code = command(argv)
    captured = capsys.readouterr()
    where = f"exit {code}\nstderr: {captured.err[-3000:]}"
    print(where)

    assert code == status, where
    assert "Traceback" not in captured.err + captured.out, where
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, where
    assert all(part.format(tmp=tmp_path) in lines[0] for part in named), where
    after = snapshot(tmp_path)
    if writes is None:
        assert after == before, where
    else:
        assert under(after, writes, False) == under(before, writes, False), where
    if case == "sweep:grid-value-with-mathtext":
        assert "$x^$" in unescape((tmp_path / "sweep" / "report.html").read_text())
