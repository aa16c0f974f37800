"""The Ray backend on a local Ray instance trains the same cells to the same numbers as the
local backend. In the default run (CI must exercise the backend the README offers), kept to
one Ray worker: starting Ray and a worker that imports torch and TransformerLens is most of
its time."""

import contextlib

import pytest

from analyses.runners.sweep import run_cells
from tests.helpers import tiny_composite_run

ray = pytest.importorskip("ray")


def test_ray_backend_matches_the_local_backend(tmp_path):
    cells = {"seed=1": tiny_composite_run(steps=12, seed=1)}  # one cell: each Ray worker imports torch afresh
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

    import analyses.runners.ray_backend as ray_backend

    monkeypatch.setattr(ray_backend, "PROBE_S", 1.0)
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
    from analyses.runners.ray_backend import use_ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert not use_ray_token() and "RAY_AUTH_MODE" not in __import__("os").environ  # no token: nothing set
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    assert use_ray_token() and __import__("os").environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's own choice stands
    assert not use_ray_token()


def test_the_token_ray_would_send_is_found_where_ray_looks(tmp_path, monkeypatch):
    """RAY_AUTH_TOKEN, else RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; only a regular file is read."""
    import os

    from analyses.runners.ray_backend import ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert ray_token()[0] is None and "does not exist" in ray_token()[1]
    (tmp_path / ".ray").mkdir()
    os.mkfifo(tmp_path / ".ray" / "auth_token")  # a FIFO would block a plain open
    assert ray_token()[0] is None and "not a regular file" in ray_token()[1]
    (tmp_path / ".ray" / "auth_token").unlink()
    (tmp_path / ".ray" / "auth_token").write_text(" home \n")
    assert ray_token() == ("home", str(tmp_path / ".ray" / "auth_token"))
    (tmp_path / "t").write_text("")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))  # named, so ~/.ray/auth_token is not looked at
    assert ray_token()[0] is None and "is empty" in ray_token()[1]
    monkeypatch.setenv("RAY_AUTH_TOKEN", "env")
    assert ray_token() == ("env", "RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_token()[0] is None and "RAY_AUTH_MODE=disabled" in ray_token()[1]


def _clean_env(home) -> dict:
    """This environment without Ray's auth and address settings, with HOME at `home`: the
    machine's own ~/.ray/auth_token must not decide what a test sees."""
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@contextlib.contextmanager
def _ray_head(env: dict):
    """A head started by `ray start --head` (a process of its own) with Ray's client server, on
    free ports and its own temp dir; yields (HOST:PORT, ray://HOST:CLIENT_PORT), stopped afterwards."""
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 characters
    try:
        started = subprocess.run([ray_cli, "start", "--head", f"--port={ports[0]}",
                                  f"--ray-client-server-port={ports[1]}",
                                  "--num-cpus=1", "--include-dashboard=false", "--node-ip-address=127.0.0.1",
                                  f"--temp-dir={temp}"], env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"127.0.0.1:{ports[0]}", f"ray://127.0.0.1:{ports[1]}"
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def _cli_sweep(out, address: str, env: dict):
    """`workbench sweep --backend ray --address ADDRESS` with two tiny cells, in a process of its
    own; returns (the finished process, seconds)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "analyses.cli", "sweep", "--preset", "composite-cpu", "--grid",
                           "train.seed=0,1", "--out", str(out), "--backend", "ray", "--address", address,
                           "--no-progress", "--set", "train.steps=8", "--set", "train.eval_every=4",
                           "--set", "train.eval_size=64", "--set", "model.d_model=32"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=600)
    return proc, time.monotonic() - started


def _home_with_token(path, token: str):
    (path / ".ray").mkdir(parents=True)
    (path / ".ray" / "auth_token").write_text(token + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("auth", ["token", "open"])
def test_a_sweep_runs_on_a_standalone_ray_head(tmp_path, auth):
    """The README's cluster path: a head started by `ray start --head`, then `workbench sweep
    --backend ray --address HOST:PORT` and `--address ray://HOST:10001`. Where ~/.ray/auth_token
    exists, Ray 2.60 starts the head with token authentication ("token") and the sweep sends the
    token; a head started with RAY_AUTH_MODE=disabled ("open") ignores the token the sweep then
    sends all the same."""
    import json

    home = _home_with_token(tmp_path / "home", "interp-workbench-test-token-0123456789abcdef")
    head_env = _clean_env(home)
    if auth == "open":
        head_env["RAY_AUTH_MODE"] = "disabled"
    with _ray_head(head_env) as addresses:
        for i, address in enumerate(addresses):
            out = tmp_path / f"sweep{i}"
            proc, seconds = _cli_sweep(out, address, _clean_env(home))
            assert proc.returncode == 0, (address, proc.stderr[-3000:])
            assert json.loads((out / "sweep.json").read_text())["counts"] == {"done": 2}
            print(f"{auth} head, {address}: exit 0, 2 cells done in {seconds:.1f} s")


@pytest.mark.slow
def test_a_token_auth_head_refuses_a_sweep_without_its_token_with_exit_2_at_once(tmp_path):
    """No token at hand (HOME without ~/.ray/auth_token, RAY_AUTH_TOKEN unset), or the wrong one:
    exit 2 within seconds naming what to set, before the sweep's folder is made (Ray alone retries
    for 30-40 s and then says only that it could not connect)."""
    home = _home_with_token(tmp_path / "home", "interp-workbench-test-token-0123456789abcdef")
    empty = tmp_path / "empty"
    empty.mkdir()
    with _ray_head(_clean_env(home)) as addresses:
        for address in addresses:
            for label, env, says in [
                ("no token", _clean_env(empty), "uses token authentication and no token was found"),
                ("wrong token", {**_clean_env(empty), "RAY_AUTH_TOKEN": "not-the-token"},
                 "refused the token from RAY_AUTH_TOKEN"),
            ]:
                out = tmp_path / "refused"
                proc, seconds = _cli_sweep(out, address, env)
                err = proc.stderr
                assert proc.returncode == 2, (label, address, err[-3000:])
                assert says in err and "RAY_AUTH_TOKEN" in err and "ray get-auth-token" in err, err[-3000:]
                assert "Traceback" not in err and "unexpected error" not in err
                assert seconds < 30, seconds
                assert not out.exists()
                print(f"{label}, {address}: exit 2 in {seconds:.1f} s: {err.strip().splitlines()[-1]}")
