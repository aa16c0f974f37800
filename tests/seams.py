"""What the project's imports look like, read from its source with `ast`: import circles, private
names taken from another folder, and names a module imports only to hand on (re-exports).

`python -m tests.seams` prints the counts and each case; tests/unit/test_seams.py holds them at 0.
Every import counts, the ones inside functions included: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "models", "interp", "analyses")  # the rooms, lowest first: each imports only those before it
# The one import that goes up a room, on purpose: looking a preset up loads the tasks' own modules
# (interp/tasks/), which register their presets and curricula (models.presets.load_task_plugins).
PLUGIN_HOOK = ("models.presets", "interp.tasks")


@dataclass
class Module:
    name: str  # dotted, e.g. "models.train"
    path: Path
    tree: ast.Module
    imports: list[tuple[str, str | None, int]] = field(default_factory=list)  # (module, name or None, line)

    @property
    def folder(self) -> str:
        """The package folder the module's file sits in ("models", "analyses.cli")."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the project's packages, with each import resolved to a project module."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = Module(_module_name(path, root), path, ast.parse(path.read_text(), filename=str(path)))
            modules[module.name] = module
    for module in modules.values():
        module.imports = list(_imports(module, modules))
    return modules


def _imports(module: Module, modules: dict[str, Module]):
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield f"{base}.{alias.name}", None, node.lineno
                elif base in modules:
                    yield base, alias.name, node.lineno


def upward_imports(modules: dict[str, Module]) -> list[str]:
    """Imports from a room into a room above it (PACKAGES' order), the plugin hook excepted."""
    rank = {package: i for i, package in enumerate(PACKAGES)}
    found = []
    for module in modules.values():
        for target, _, line in module.imports:
            if (rank[target.split(".")[0]] > rank[module.name.split(".")[0]]
                    and (module.name, target) != PLUGIN_HOOK):
                found.append(f"{module.name}:{line} imports {target}")
    return sorted(set(found))


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted; lazy imports count,
    the plugin hook does not."""
    graph = {name: sorted({target for target, _, _ in m.imports if target != name and (name, target) != PLUGIN_HOOK})
             for name, m in modules.items()}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return sorted(groups)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(modules: dict[str, Module], across_folders_only: bool = True) -> list[str]:
    """`from pkg.mod import _name`, or `mod._name` on an imported project module, from another folder."""
    found = []
    for module in modules.values():
        aliases = {}  # local name -> project module, for attribute reads
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    for target, name, _ in module.imports:
                        if name is None and target.endswith(f".{alias.name}"):
                            aliases[alias.asname or alias.name] = target
        for target, name, line in module.imports:
            if name and _private(name) and _crosses(module, modules[target], across_folders_only):
                found.append(f"{module.name}:{line} imports {target}.{name}")
        for node in ast.walk(module.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                    and node.value.id in aliases):
                target = aliases[node.value.id]
                if _crosses(module, modules[target], across_folders_only):
                    found.append(f"{module.name}:{node.lineno} reads {target}.{node.attr}")
    return sorted(set(found))


def _crosses(importer: Module, target: Module, across_folders_only: bool) -> bool:
    if importer.name == target.name:
        return False
    return importer.folder != target.folder if across_folders_only else True


def reexports(modules: dict[str, Module]) -> list[str]:
    """Names a module imports at its top level from another project module and never uses itself:
    kept only so that other code can import them from here. A package's `__init__` that names its
    public API in `__all__` is not counted for the names `__all__` lists."""
    found = []
    for module in modules.values():
        used = {node.id for node in ast.walk(module.tree) if isinstance(node, ast.Name)}
        used |= {_root_name(node) for node in ast.walk(module.tree) if isinstance(node, ast.Attribute)}
        used |= _string_annotation_names(module.tree)
        public = _dunder_all(module.tree) if module.path.name == "__init__.py" else set()
        for node in module.tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                resolved = [t for t, n, line in module.imports if line == node.lineno and (n == alias.name
                            or (n is None and t.endswith(f".{alias.name}")))]
                if not resolved or local in used or local in public:
                    continue
                if resolved[0].endswith(f".{alias.name}") and resolved[0] in modules and not alias.asname:
                    continue  # `from pkg import submodule` loads the submodule: an import for its effect
                found.append(f"{module.name}:{node.lineno} hands on {resolved[0]}.{alias.name}")
    return sorted(found)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _string_annotation_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                parsed = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            names |= {n.id for n in ast.walk(parsed) if isinstance(n, ast.Name)}
    return names


def _dunder_all(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                and isinstance(node.value, (ast.List, ast.Tuple))):
            return {elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)}
    return set()


def main() -> None:
    modules = load()
    groups = circles(modules)
    private = private_imports(modules)
    handed = reexports(modules)
    upward = upward_imports(modules)
    print(f"{len(modules)} modules")
    print(f"imports up a room (besides the plugin hook {' -> '.join(PLUGIN_HOOK)}): {len(upward)}")
    for line in upward:
        print("  " + line)
    print(f"import circles: {len(groups)}")
    for group in groups:
        print("  " + " <-> ".join(group))
    print(f"private names from another folder: {len(private)}")
    for line in private:
        print("  " + line)
    print(f"private names from another module (same folder included): {len(private_imports(modules, False))}")
    print(f"re-exports: {len(handed)}")
    for line in handed:
        print("  " + line)


if __name__ == "__main__":
    main()
