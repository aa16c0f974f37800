"""What a newcomer runs first works from a fresh Python: `workbench --help` and every command's
`--help` import no torch, TransformerLens or matplotlib (seconds each on a loaded machine), and a
preset is found by name with nothing imported before.

The checks of what the workbench's own modules need imported first run in forks of one Python
that has imported torch and TransformerLens but nothing of the workbench (`unimported`): what
they check is the order among the workbench's modules, and a fresh interpreter per check spent
7-12 s importing the same libraries. The check that --help imports no library at all runs in a
fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformer_lens", "matplotlib")


def _fresh_python(code: str) -> str:
    """stdout of `code` run in a new interpreter from the repository root."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_of_workbench_and_of_every_command_imports_nothing_heavy():
    out = _fresh_python(
        "import contextlib, io, sys\n"
        "from analyses.cli import main\n"
        "from analyses.cli.parser import build_parser\n"
        "commands = list(build_parser()._subparsers._group_actions[0].choices)\n"
        "for argv in [['--help']] + [[c, '--help'] for c in commands]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        f"print(len(commands), sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n")
    n_commands, loaded = out.split(" ", 1)
    assert int(n_commands) >= 10 and loaded.strip() == "[]"


# a Python that imports LIBRARIES, then runs each check it reads (a JSON string a line) in a fork of
# itself and answers with the fork's exit status and output (a JSON object a line)
FORKING = """
import json, os, sys, tempfile, traceback
for library in sys.argv[1:]:
    __import__(library)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("analyses", "interp", "models", "tasks"))),
      flush=True)
for line in sys.stdin:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            exec(compile(json.loads(line), "<check>", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out.seek(0)
    err.seek(0)
    print(json.dumps({"code": status, "stdout": out.read().decode(), "stderr": err.read().decode()}), flush=True)
"""
LIBRARIES = ("torch", "transformer_lens")


@pytest.fixture(scope="module")
def unimported():
    """`unimported(code)`: stdout of `code` run in a fork of a Python that has imported LIBRARIES and
    none of the workbench's modules."""
    forking = subprocess.Popen([sys.executable, "-c", FORKING, *LIBRARIES], cwd=ROOT, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert json.loads(forking.stdout.readline()) == []  # nothing of the workbench before the first check

    def run(code: str) -> str:
        forking.stdin.write(json.dumps(code) + "\n")
        forking.stdin.flush()
        done = json.loads(forking.stdout.readline())
        assert done["code"] == 0, done["stderr"]
        return done["stdout"]

    yield run
    forking.kill()  # its own exit would spend seconds tearing torch down
    forking.wait(timeout=60)


def test_get_preset_from_a_fresh_python_with_nothing_imported_first(unimported):
    out = unimported("from models.presets import get_preset\nprint(get_preset('lego-cpu').task.name)")
    assert out.strip() == "lego"


def test_the_run_folder_modules_and_the_step_probe_import_first_in_a_fresh_python(unimported):
    # models/run_folder.py and models/runs.py import each other; either may come first
    for module in ("models.run_folder", "models.runs", "analyses.research.step_probe"):
        assert unimported(f"import {module}; print('ok')").strip() == "ok"


def test_a_check_that_fails_in_the_forking_python_fails_the_test(unimported):
    with pytest.raises(AssertionError, match="ImportError"):
        unimported("from models.runs import no_such_name")
