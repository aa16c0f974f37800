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


def _sweep_at(tmp_path, address: str) -> int:
    from analyses.cli import main

    return main(["sweep", "--preset", "composite-cpu", "--grid", "train.seed=0", "--out", str(tmp_path / "s"),
                 "--backend", "ray", "--address", address, "--no-progress", "--set", "train.steps=2"])


def test_address_auto_without_a_cluster_is_exit_2_naming_what_to_do(tmp_path, capsys, monkeypatch):
    from ray._private.services import find_gcs_addresses

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine, so `auto` finds one")
    assert _sweep_at(tmp_path, "auto") == 2
    err = capsys.readouterr().err
    # no cluster at all, or only the stale address file of a stopped `ray start`
    assert ("no running Ray cluster found" in err or "nothing answers" in err) and "ray start --head" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_that_is_not_a_ray_server_is_exit_2_within_seconds(tmp_path, capsys, monkeypatch, scheme):
    """A server that accepts connections but does not speak gRPC (a web server, a database)."""
    import socket
    import threading
    import time

    import analyses.sweep as sweep

    monkeypatch.setattr(sweep, "PROBE_S", 1.0)
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(8)), daemon=True).start()
    started = time.monotonic()
    try:
        code = _sweep_at(tmp_path, f"{scheme}127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code == 2 and "is not a Ray cluster" in err and "Traceback" not in err
    assert time.monotonic() - started < 10
    assert not (tmp_path / "s").exists()


def test_a_token_at_hand_is_sent_to_the_cluster(tmp_path, monkeypatch):
    """Ray 2.60 sends no token to an explicit address unless RAY_AUTH_MODE=token; a cluster
    started where ~/.ray/auth_token exists wants one."""
    from analyses.sweep import use_ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert not use_ray_token() and "RAY_AUTH_MODE" not in __import__("os").environ  # no token: nothing set
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    assert use_ray_token() and __import__("os").environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's own choice stands
    assert not use_ray_token()


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
