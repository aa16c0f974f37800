"""The suite's runtime type check: jaxtyping's import hook with beartype over tasks, models and
interp, decorating each module's functions, methods and classes but not the functions defined
inside functions. Those are hooks and closures made anew on every call (a patching hook per edge
set, a hook per layer), so decorating them cost a beartype compilation per call (most of what
the check cost an analysis test), for checks of arguments that the enclosing, checked function
has already passed in. Should jaxtyping's internals change, the stock hook (every function) is
used.

The libraries the packages import as they load (LIBRARIES) are imported before the hook is
installed. jaxtyping's loader swaps importlib's bytecode-cache path for its own while it executes
an instrumented module, so a library first imported from inside one finds no cached bytecode
under the swapped name and is compiled from source: torch, TransformerLens and transformers
again in every test process."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator

from beartype import beartype  # noqa: F401 (named by CHECKER: the decorator the hook applies)

CHECKER = "tests.typecheck.beartype"  # its own name: the transformed modules are cached apart from the stock hook's
PACKAGES = ["tasks", "models", "interp"]
LIBRARIES = ["torch", "transformer_lens", "matplotlib.pyplot", "numpy", "safetensors.torch", "einops", "tqdm"]


@contextlib.contextmanager
def typechecked_imports() -> Iterator[None]:
    """Within it, imports of PACKAGES are instrumented."""
    import importlib

    from jaxtyping import _import_hook, install_import_hook

    for library in LIBRARIES:
        importlib.import_module(library)

    stock = getattr(_import_hook, "JaxtypingTransformer", None)
    if stock is None or not hasattr(stock, "visit_FunctionDef"):
        with install_import_hook(PACKAGES, "beartype.beartype"):
            yield
        return

    class OuterFunctionsOnly(stock):
        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
            if any(isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) for parent in self._parents):
                self._parents.append(node)
                self.generic_visit(node)
                self._parents.pop()
                return node
            return super().visit_FunctionDef(node)

    _import_hook.JaxtypingTransformer = OuterFunctionsOnly
    try:
        with install_import_hook(PACKAGES, CHECKER):
            yield
    finally:
        _import_hook.JaxtypingTransformer = stock
