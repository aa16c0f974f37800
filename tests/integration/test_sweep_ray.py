"""The Ray backend on a local Ray instance trains the same cells to the same numbers as the
local backend. In the default run (CI must exercise the backend the README offers), kept to
one Ray worker: starting Ray and a worker that imports torch and TransformerLens is most of
its time."""

import pytest

from analyses.sweep import run_cells
from tests.helpers import tiny_composite_run

ray = pytest.importorskip("ray")


def test_ray_backend_matches_the_local_backend(tmp_path):
    cells = {f"seed={s}": tiny_composite_run(steps=12, seed=s) for s in (0, 1)}
    local = run_cells(cells, tmp_path / "local", workers=1, progress=False)
    on_ray = run_cells(cells, tmp_path / "ray", workers=1, backend="ray", progress=False)
    assert not ray.is_initialized()  # the instance it started is stopped again
    assert list(on_ray) == list(cells)
    for name in cells:
        assert local[name].status == on_ray[name].status == "done"
        assert {k: v for k, v in local[name].final.items() if k != "elapsed_s"} == \
               {k: v for k, v in on_ray[name].final.items() if k != "elapsed_s"}
    assert (tmp_path / "ray" / "seed=1" / "model.safetensors").exists()


@pytest.mark.parametrize("address, message", [
    ("127.0.0.1:1", "nothing answers at 127.0.0.1:1"),
    ("ray://127.0.0.1:1", "nothing answers at 127.0.0.1:1|needs Ray's client"),
    ("head-without-port", "is not HOST:PORT"),
])
def test_a_cluster_address_that_cannot_work_is_exit_2_at_once(tmp_path, capsys, address, message):
    import time

    from analyses.cli import main

    started = time.monotonic()
    code = main(["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0", "--out", str(tmp_path / "s"),
                 "--backend", "ray", "--address", address, "--no-progress", "--set", "train.steps=2"])
    err = capsys.readouterr().err
    assert code == 2 and __import__("re").search(message, err) and "Traceback" not in err
    assert not (tmp_path / "s").exists()  # refused before the sweep's folder is made
    assert time.monotonic() - started < 30  # Ray alone retries such an address for minutes


@pytest.mark.slow
def test_a_sweep_runs_on_a_standalone_ray_head(tmp_path):
    """The README's cluster path: a head started by `ray start --head` (a process of its own),
    then `workbench sweep --backend ray --address HOST:PORT`; the head is stopped afterwards."""
    import json
    import os
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 characters
    started = subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                              "--node-ip-address=127.0.0.1", f"--temp-dir={temp}"], env=env, capture_output=True,
                             text=True, timeout=180)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    try:
        out = tmp_path / "sweep"
        proc = subprocess.run([sys.executable, "-m", "analyses.cli", "sweep", "--preset", "composite-cpu", "--grid",
                               "train.seed=0,1", "--out", str(out), "--backend", "ray", "--address",
                               f"127.0.0.1:{port}", "--no-progress", "--set", "train.steps=8", "--set",
                               "train.eval_every=4", "--set", "train.eval_size=64", "--set", "model.d_model=32"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((out / "sweep.json").read_text())["counts"] == {"done": 2}
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
