"""What the docs say about the code is what the code does: every file a source file or a doc
cites exists; the README names every preset `workbench presets` lists; docs/run-folder.md lists
exactly the exit statuses the command line ends with."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import signal
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("tasks", "models", "interp", "analyses", "tests")
SKIPPED_FOLDERS = {".venv", "runs", "node_modules", "__pycache__", ".git"}
# A path from the repository's root, e.g. `docs/training.md` or `interp/patching/exact.py` (not
# `interp/tasks/<name>.py` or `tests/unit/test_*.py`, which name no one file).
CITED_PATH = re.compile(r"(?<![\w/.*<>{}-])((?:docs|tasks|models|interp|analyses|tests|zoo)/[\w./-]*\w"
                        r"\.(?:py|md|json|ipynb|txt))(?![\w/*])")
# A bare upper-case markdown file, e.g. `RESULTS.md` or `CONTRIBUTING.md`: it must exist in some folder.
CITED_NAME = re.compile(r"(?<![\w/.*<>{}-])([A-Z][A-Z_]*\.md)\b")
# Names a citation may still use while the files citing them are being moved (empty: none may).
PENDING: dict[str, str] = {}


def _files(pattern: str, folders: tuple[str, ...] | None = None) -> list[Path]:
    roots = [ROOT / f for f in folders] if folders else [ROOT]
    return sorted(p for root in roots for p in root.rglob(pattern)
                  if not SKIPPED_FOLDERS & set(p.relative_to(ROOT).parts))


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a markdown file's text, or a Python file's comments and docstrings."""
    text = path.read_text()
    if path.suffix == ".md":
        return [(1, text)]
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def cited_files() -> list[tuple[str, int, str]]:
    """(citing file, line, cited path or name) for every citation in the docs and sources."""
    cited = []
    for path in _files("*.md") + _files("*.py", SOURCE_PACKAGES):
        for line, text in _prose(path):
            for pattern in (CITED_PATH, CITED_NAME):
                cited += [(path.relative_to(ROOT).as_posix(), line, m.group(1)) for m in pattern.finditer(text)]
    return cited


def test_the_citation_patterns_find_paths_and_names_and_skip_placeholders():
    text = "see docs/training.md and (RESULTS.md), `interp/tasks/<name>.py`, tests/unit/test_*.py, /tmp/docs/x.md"
    assert [m.group(1) for m in CITED_PATH.finditer(text)] == ["docs/training.md"]
    assert [m.group(1) for m in CITED_NAME.finditer(text)] == ["RESULTS.md"]


def test_every_file_a_source_file_or_doc_cites_exists():
    names = {p.name for p in _files("*")}
    missing, pending = [], set()
    for where, line, target in cited_files():
        exists = (ROOT / target).exists() if "/" in target else target in names
        if exists:
            continue
        if target in PENDING:
            pending.add(target)
        else:
            missing.append(f"{where}:{line} cites {target}, which the repository does not have")
    assert not missing, "\n".join(missing)
    stale = set(PENDING) - pending
    assert not stale, f"nothing cites {sorted(stale)} any more: remove them from PENDING"


def _presets_listed() -> list[str]:
    from analyses.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["presets"]) == 0
    return [line.split()[0] for line in out.getvalue().splitlines()[1:]]  # under the header, one line a preset


def test_the_readme_names_every_preset():
    paragraph = next(p for p in (ROOT / "README.md").read_text().split("\n\n") if p.startswith("Presets"))
    named = set(re.findall(r"`([\w-]+)`", paragraph)) - {"workbench"}
    listed = _presets_listed()
    assert len(listed) >= 4
    assert named == set(listed), f"README.md's Presets paragraph must name exactly {sorted(listed)}"


def _documented_statuses() -> set[int]:
    text = (ROOT / "docs" / "run-folder.md").read_text()
    section = text[text.index("## Exit statuses"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    cells = re.findall(r"^\| ([\d, ]+) \|", section, re.MULTILINE)
    return {int(n) for cell in cells for n in cell.split(",")}


def _stop_signals() -> set[int]:
    """The signals a sweep turns into 128 + signal (STOP_SIGNALS, wherever the sweep runner is)."""
    found = set()
    for path in _files("*.py", ("analyses",)):
        match = re.search(r"^STOP_SIGNALS = \(([^)]*)\)", path.read_text(), re.MULTILINE)
        if match:
            found |= {int(getattr(signal, name)) for name in re.findall(r"signal\.(SIG\w+)", match.group(1))}
    return found


def test_the_documented_exit_statuses_are_the_command_lines(monkeypatch, capsys):
    import argparse

    import analyses.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        lambda self, argv=None: argparse.Namespace(command="presets", debug=False, run=interrupted))
    interrupt = cli.main(["presets"])
    assert "workbench presets: interrupted" in capsys.readouterr().err
    constants = {value for name, value in vars(cli).items() if name.startswith("EXIT_") and isinstance(value, int)}
    assert len(constants) >= 4 and _stop_signals() == {signal.SIGTERM, signal.SIGHUP}
    code = {0, interrupt, *constants, *(128 + s for s in _stop_signals())}
    assert _documented_statuses() == code

