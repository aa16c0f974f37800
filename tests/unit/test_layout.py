"""The layout holds: the generic rooms (models/, the command line) name no task, so a task is its own
files only; the command line is one short module per command; and every `python -m MODULE` the
docs and scripts show names a module that exists and runs as a script, so a moved module cannot
silently break a documented command."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERIC = sorted([*(ROOT / "models").glob("*.py"), *(ROOT / "analyses" / "cli").glob("*.py")])
# where the docs and scripts show commands (analyses/**/*.md: the findings log, however it is split)
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "Makefile", ROOT / ".ci" / "run",
                    *(ROOT / "docs").glob("*.md"), *(ROOT / "analyses").glob("**/*.md"),
                    *(ROOT / "analyses" / "gpu").glob("*.sh")])
OURS = ("analyses", "tasks", "models", "interp", "tests")
PYTHON_M = re.compile(r"""(?:python3?|\$py"?|\$\{?PYTHON\}?|/bin/python)\s+-m\s+([A-Za-z_][\w.]*)""")
HELP_KEYWORDS = ("help", "description", "epilog")
CLI_MODULE_MAX_LINES = 150


def _words_naming_tasks() -> tuple[list[re.Pattern], set[str]]:
    """Patterns for the registered tasks' names (also as the start of a preset's or curriculum's
    name, e.g. `x-cpu`), their presets and curricula, and the identifiers of their classes."""
    import interp.tasks  # noqa: F401 (each task's presets and curricula)
    from models.curriculum import CURRICULA
    from models.presets import PRESETS
    from tasks import registered_task, task_names

    names = [*task_names(), *PRESETS, *CURRICULA]
    patterns = [re.compile(rf"(?<![\w-]){re.escape(name)}(?![a-z0-9])") for name in names]
    classes = set()
    for task in task_names():
        registered = registered_task(task)
        classes |= {registered.config.__name__, registered.task.__name__, registered.task.__module__.rsplit(".")[-1]}
    return patterns, classes


def _help_text_nodes(tree: ast.Module) -> set[int]:
    """The ids of string nodes that are documentation, not behaviour: docstrings, argparse's
    help/description texts and module constants named *_HELP or _DESCRIPTION (examples of use)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skipped.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg in HELP_KEYWORDS:
            skipped |= {id(n) for n in ast.walk(node.value)}
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and re.search(r"HELP|DESCRIPTION", t.id)
                                                for t in node.targets):
            skipped |= {id(n) for n in ast.walk(node.value)}
    return skipped


def _task_names_in(path: Path, patterns: list[re.Pattern], classes: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _help_text_nodes(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if any(p.search(node.value) for p in patterns):
                found.append(f"{where}: {node.value!r}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            named = [name for name in [*modules, *(a.name for a in node.names)]
                     if set(name.split(".")) & classes or name.startswith("interp.tasks.")]
            found += [f"{where}: imports {name}" for name in named[:1]]  # `import interp.tasks` loads them all
        elif (name := getattr(node, "id", None) or getattr(node, "attr", None)) in classes:
            found.append(f"{where}: uses {name}")
    return found


def test_models_and_the_command_line_name_no_task():
    """A task's presets, curricula, default preset and metrics are registered by the task (its
    modules in tasks/ and interp/tasks/); models/ and analyses/cli/ only ask the registries. Help
    texts and docstrings may give a task as an example."""
    patterns, classes = _words_naming_tasks()
    assert patterns and classes
    found = [f"{path.parent.name}/{hit}" for path in GENERIC for hit in _task_names_in(path, patterns, classes)]
    assert not found, "a generic module names a task:\n" + "\n".join(found)


def test_the_task_name_check_sees_a_task_named_in_code(tmp_path):
    """The check above is not blind: a preset's name in a string, or a task's config class, is found."""
    patterns, classes = _words_naming_tasks()
    from models.presets import QUICK_START
    from tasks import registered_task, task_names

    config = registered_task(task_names()[0]).config.__name__
    probe = tmp_path / "generic.py"
    probe.write_text(f'"""Docstring {QUICK_START[0]} is fine."""\nfrom tasks import {config}\n'
                     f'NAME = "{QUICK_START[0]}"\n', encoding="utf-8")
    assert len(_task_names_in(probe, patterns, classes)) == 2


def test_each_command_of_the_command_line_is_one_short_module():
    from analyses.cli.parser import COMMANDS

    for module in COMMANDS:
        lines = Path(module.__file__).read_text(encoding="utf-8").count("\n")
        assert lines <= CLI_MODULE_MAX_LINES, f"{module.__name__} is {lines} lines"
        assert callable(module.add_parser) and (callable(getattr(module, "run", None)) or module.__name__.endswith(
            "circuit")), module.__name__


def _documented_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for doc in DOCUMENTS:
        if not doc.is_file():
            continue
        for match in PYTHON_M.finditer(doc.read_text(encoding="utf-8")):
            module = match.group(1).rstrip(".")
            if module.split(".")[0] in OURS and not any(part.isupper() for part in module.split(".")):  # NAME: a slot
                found.setdefault(module, str(doc.relative_to(ROOT)))
    return found


def test_the_docs_show_python_m_commands():
    modules = _documented_modules()
    assert "analyses.cli" in modules and len(modules) >= 5, modules


@pytest.mark.parametrize("module", sorted(_documented_modules()))
def test_every_documented_python_m_module_exists_and_runs_as_a_script(module):
    """`python -m MODULE` as written in the docs: the module is found, and it is a script (a
    package with __main__.py, or a module with an `if __name__ == "__main__":` block)."""
    where = _documented_modules()[module]
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{where} runs `python -m {module}`, which does not exist"
    if spec.submodule_search_locations:
        main = Path(spec.origin).parent / "__main__.py"
        assert main.is_file(), f"{where} runs `python -m {module}`, a package without __main__.py"
        return
    text = Path(spec.origin).read_text(encoding="utf-8")
    assert re.search(r"^if __name__ == [\"']__main__[\"']:", text, re.MULTILINE), (
        f"{where} runs `python -m {module}`, which has no `if __name__ == \"__main__\":` block")


