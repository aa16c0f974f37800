"""Every notebook in analyses/notebooks runs top to bottom at the tiny scale, as a real notebook:
jupytext reads the percent-format `.py`, nbclient executes it cell by cell in an ipykernel, so a
changed public API breaks this test rather than a user's afternoon. A new notebook is picked up
by its file name (`NN_name.py`); each one's wall time is printed at the end of the module.

The notebooks share one kernel, started by the first of them and shut down at the end of the
module, because importing torch and TransformerLens takes ~12 s of a tiny notebook's ~20 s in
every new kernel. Before each notebook's own cells a setup cell resets the kernel: it clears the
user namespace (`%reset -f`, so a notebook that forgets an import of its own still fails with a
NameError), points WORKBENCH_NOTEBOOK_SCALE/_OUT at tiny and the test's tmp_path, and changes
to the repository root; its outputs are not part of what the assertions see. A notebook that
fails (or whose kernel dies) gets its kernel shut down, so the next one starts a fresh kernel.
What the reset does not undo is imported modules (sys.modules): a notebook that relies on a
module another notebook imported for a side effect would pass here and fail for a user, who
always gets a fresh kernel. So, too, the wall time printed for the notebook that started the
kernel is what a user waits for; for the others it excludes the kernel start and the imports."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="notebook tests need the test extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the test extra: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="notebook tests need the test extra: pip install -e '.[test]'")
jupyter_client = pytest.importorskip("jupyter_client")  # nbclient's dependency
nbformat = pytest.importorskip("nbformat")  # nbclient's dependency
run_sync = nbclient.util.run_sync  # jupyter_core's: runs the async kernel manager's coroutines

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "analyses" / "notebooks").glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT_S = 300  # a tiny notebook takes seconds; this only stops a hung kernel
SECONDS: dict[str, tuple[float, bool]] = {}  # notebook: (wall time, whether it started the kernel)
# the kernel inherits the environment: one thread is faster for tiny models and immune to a busy
# second core (with two threads and the other core loaded, 40 steps took 39 s, not 1 s)
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "WORKBENCH_NOTEBOOK_SCALE": "tiny"}
# run in the shared kernel before each notebook's own cells; binds no name in the user namespace
SETUP_CELL = """\
get_ipython().run_line_magic("reset", "-f")
__import__("os").environ.update({env})
__import__("os").chdir({root!r})
if "matplotlib.pyplot" in __import__("sys").modules:
    __import__("sys").modules["matplotlib.pyplot"].close("all")
"""


@pytest.fixture(scope="module", autouse=True)
def report_times(request):
    """Print each notebook's wall time (its cells; for the first also kernel start and imports)."""
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None or not SECONDS:
        return
    with capture.global_and_fixture_disabled():  # teardown output is captured otherwise
        reporter.write_line("")
        for name, (seconds, started) in SECONDS.items():
            shared = "kernel start and imports included" if started else "shared kernel: no start, no imports"
            reporter.write_line(f"notebook {name}: {seconds:.1f} s at WORKBENCH_NOTEBOOK_SCALE=tiny ({shared})")


class SharedKernel:
    """The kernel manager the module's notebooks share. The first client that runs starts its kernel
    (as nbclient starts one of its own: cwd, in-memory history); after a failure it is shut down
    and replaced (a shut-down manager cannot start again), so the next notebook starts afresh."""

    def __init__(self):
        self.km = jupyter_client.AsyncKernelManager(kernel_name="python3")

    def shutdown(self):
        if self.km.has_kernel:
            run_sync(self.km.shutdown_kernel)(now=True)

    def replace(self):
        self.shutdown()
        self.km = jupyter_client.AsyncKernelManager(kernel_name="python3")


@pytest.fixture(scope="module")
def kernel():
    shared = SharedKernel()
    yield shared
    shared.shutdown()


def test_the_folder_has_notebooks():
    assert [p.name for p in NOTEBOOKS][:2] == ["01_lego.py", "02_composite.py"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom_at_tiny_scale(path, tmp_path, kernel):
    notebook = jupytext.read(path)
    assert any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells), \
        f"{path.name} needs a cell tagged 'parameters' that reads WORKBENCH_NOTEBOOK_SCALE"
    env = {**KERNEL_ENV, "WORKBENCH_NOTEBOOK_OUT": str(tmp_path)}
    notebook.cells.insert(0, nbformat.v4.new_code_cell(SETUP_CELL.format(env=env, root=str(ROOT))))
    starts_kernel = not kernel.km.has_kernel
    started = time.perf_counter()
    client = nbclient.NotebookClient(notebook, km=kernel.km, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    ran = False
    try:
        # raises CellExecutionError, with the cell and traceback, if any cell fails; env= and the
        # cwd from resources are used only when this client starts the kernel
        client.execute(cleanup_kc=False, env={**os.environ, **env})
        ran = True
    finally:
        if client.kc is not None:  # the client does not own the kernel, so it leaves its channels open
            client.kc.stop_channels()
            client.kc = None
        if not ran:  # whatever the notebook left running or broken: the next one starts afresh
            kernel.replace()
    SECONDS[path.name] = (time.perf_counter() - started, starts_kernel)
    del notebook.cells[0]  # the setup cell: only the notebook's own cells' outputs count below
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    html = "".join(out.get("data", {}).get("text/html", "") for out in outputs)
    assert "AttentionHeads" in html, f"{path.name} shows no circuitsvis attention view"
    assert "<img" in html and "data:image/png;base64," in html, f"{path.name} shows no figure"
    assert not [out for out in outputs if out.get("output_type") == "error"]
    assert list(tmp_path.iterdir()), f"{path.name} trained nothing under WORKBENCH_NOTEBOOK_OUT (see the README)"
