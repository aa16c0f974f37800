"""The imports hold the house together the way docs/design.md says: no circle of imports (lazy
ones included), no room importing from a room above it (one plugin hook excepted), no private name
taken from another folder, and no name imported only to be handed on (tests/seams.py reads them
from the source; `python -m tests.seams` prints each case)."""

import ast

from tests import seams


def test_no_import_circles():
    assert seams.circles(seams.load()) == []


def test_rooms_import_only_the_rooms_below_them():
    assert seams.upward_imports(seams.load()) == []


def test_no_private_name_is_imported_from_another_folder():
    assert seams.private_imports(seams.load()) == []


def test_no_module_hands_on_what_it_imports():
    assert seams.reexports(seams.load()) == []


def _module(name: str, source: str, path: str) -> seams.Module:
    return seams.Module(name, seams.ROOT / path, ast.parse(source))


def test_the_checks_see_what_they_look_for():
    """Each check finds its case in a small made-up house: a lazy circle, an upward import, a
    private name from another folder, a name handed on."""
    modules = {m.name: m for m in [
        _module("models.a", "def f():\n    from models.b import g\n", "models/a.py"),
        _module("models.b", "from models.a import f\nfrom tasks.t import _hidden\nfrom tasks.t import kept\n"
                            "def g():\n    return f, _hidden\n", "models/b.py"),
        _module("models.c", "", "models/c.py"),
        _module("tasks.t", "def _hidden(): ...\ndef kept(): ...\ndef up():\n    import models.c\n", "tasks/t.py"),
    ]}
    for module in modules.values():
        module.imports = list(seams._imports(module, modules))
    assert seams.circles(modules) == [["models.a", "models.b"]]
    assert seams.upward_imports(modules) == ["tasks.t:4 imports models.c"]
    assert seams.private_imports(modules) == ["models.b:2 imports tasks.t._hidden"]
    assert seams.reexports(modules) == ["models.b:3 hands on tasks.t.kept"]
