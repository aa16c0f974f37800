"""What a newcomer runs first works from a fresh Python: `workbench --help` and every command's
`--help` import no torch, TransformerLens or matplotlib (seconds each on a loaded machine), and a
preset is found by name with nothing imported before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_get_preset_from_a_fresh_python_with_nothing_imported_first():
    out = _fresh_python("from models.presets import get_preset\nprint(get_preset('lego-cpu').task.name)")
    assert out.strip() == "lego"


def test_the_run_folder_modules_and_the_step_probe_import_first_in_a_fresh_python():
    # models/run_folder.py and models/runs.py import each other; either may come first
    for module in ("models.run_folder", "models.runs", "analyses.research.step_probe"):
        assert _fresh_python(f"import {module}; print('ok')").strip() == "ok"
