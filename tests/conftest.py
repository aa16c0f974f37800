"""Shared fixtures. jaxtyping annotations of the workbench are checked at runtime by beartype in
the tests (tests/typecheck.py; the import hook must run before the packages are imported, so it
runs when pytest is configured, before any test module is collected)."""

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def pytest_configure(config):
    """Import the workbench's packages through the type-checking hook, in every process that runs
    tests. Not in pytest-xdist's controller (`-n N`): it only hands test files to its workers, so
    the imports (15-20 s of importing and instrumenting) would delay every worker's start."""
    if config.getoption("numprocesses", default=None) and not hasattr(config, "workerinput"):
        return
    from tests.typecheck import typechecked_imports

    with typechecked_imports():
        import interp.analysis  # noqa: F401
        import interp.attention  # noqa: F401
        import interp.patching  # noqa: F401
        import interp.probes  # noqa: F401
        import interp.report  # noqa: F401
        import interp.tasks  # noqa: F401 (every task's analysis: verdicts, probe maps)
        import models.factory  # noqa: F401
        import models.train  # noqa: F401
        import tasks  # noqa: F401
    import torch

    # test models are tiny: one thread is faster than two, and immune to a busy second core
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where CUDA is; elsewhere they are reported as skipped, with why."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device on this machine (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def gen():
    from tasks import seeded_generator

    return seeded_generator(1234)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the tests that open pages in a real browser (tests/browser.py: a
    skip naming what is missing, or a failure in CI)."""
    from tests.browser import headless_chromium

    with headless_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="session")
def built_once(tmp_path_factory) -> Callable[[str, Callable[[Path], Path]], Path]:
    """`built_once(name, build)`: what `build(folder)` returns, built into an empty `folder` once
    per test session, shared by the pytest-xdist workers (the first to ask builds it under a file
    lock; one that asks meanwhile waits, then reads it). For a folder that test files of their own
    would each train or analyse again; read it only, and copy it before changing anything."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is a folder of the session's
        root = root.parent
    shared = root / "built-once"
    shared.mkdir(exist_ok=True)

    def get(name: str, build: Callable[[Path], Path]) -> Path:
        folder, done = shared / name, shared / f"{name}.built"
        with open(shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a build that failed part-way
                folder.mkdir()
                done.write_text(str(build(folder).relative_to(folder)))
        return folder / done.read_text()

    return get
