"""The `ray` backend of the sweep runner (analyses/runners/sweep.py): each cell a Ray task, on a
cluster (`--address`, checked within seconds: it answers, speaks gRPC and takes our token) or on a
local Ray instance. Imported only when a sweep asks for Ray."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyses.runners.cell import CellResult, call_with_threads, train_cell
from analyses.runners.lifeline import dying_with, machine_key, watched_pid
from tasks import ConfigError


def _ray_cell(driver: tuple[int, str], name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """One cell as a Ray task, with one torch thread. On the driver's machine the Ray worker dies
    with the driver (a killed sweep leaves no cell training); on other machines Ray itself
    stops the tasks of a job whose driver has gone."""
    with dying_with(watched_pid(driver)):
        return call_with_threads(train_cell, 1, name, cfg_dict, run_dir)


PROBE_S = 5.0  # seconds a cluster address has to answer, and to speak gRPC (Ray's protocol)


def check_ray_address(address: str) -> str:
    """Refuse, at once and naming it, a cluster address that cannot work: not HOST:PORT or
    ray://HOST:PORT, `auto` with no cluster running here, a ray:// address without Ray's
    client installed, one where nothing answers, or one that does not speak gRPC (not a Ray
    server); Ray itself retries such addresses for minutes. Returns the address to connect to
    (`auto` resolved)."""
    if address == "auto":
        address = _resolve_auto()
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--address {address!r} is not HOST:PORT (a head started with `ray start --head`, port 6379 "
                          f"by default) or ray://HOST:PORT (Ray's client server, port 10001)")
    if address.startswith("ray://"):
        try:
            import grpc  # noqa: F401 (Ray's client speaks gRPC)
        except ImportError:
            raise ConfigError(f"--address {address} needs Ray's client: pip install 'ray[client]' (the "
                              f"interp-workbench[ray] extra carries it)") from None
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except (OSError, OverflowError) as err:
        raise ConfigError(f"--address {address}: nothing answers at {host}:{port} "
                          f"({getattr(err, 'strerror', None) or err}); "
                          f"start a cluster with `ray start --head` and pass the address it prints") from None
    _check_speaks_grpc(address, host, port)
    _check_token_accepted(address, host, port)
    return address


def _resolve_auto() -> str:
    """The address `auto` stands for (RAY_ADDRESS, or the cluster `ray start` last started here)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'interp-workbench[ray]'") from None
    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except Exception as err:  # noqa: BLE001 (Ray raises ConnectionError, ValueError ... for a missing cluster)
        raise ConfigError(f"--address auto: no running Ray cluster found on this machine ({err}); start one with "
                          f"`ray start --head`, or give its address (HOST:PORT), or leave --address out for a "
                          f"local Ray instance") from None


def _check_speaks_grpc(address: str, host: str, port: str) -> None:
    """A Ray head (GCS) and Ray's client server both speak gRPC: a server that does not finish a
    gRPC handshake within PROBE_S seconds is not Ray."""
    try:
        import grpc
    except ImportError:
        return
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=PROBE_S)
    except grpc.FutureTimeoutError:
        raise ConfigError(f"--address {address}: the server at {host}:{port} is not a Ray cluster (it does not speak "
                          f"gRPC); pass the address that `ray start --head` prints (HOST:6379 by default) or "
                          f"ray://HOST:10001") from None
    finally:
        channel.close()


# A request to each kind of Ray server that any caller may make: the head's (GCS) cluster id, and the
# client server's ping (ClusterInfoRequest{type: PING}). Both are refused as UNAUTHENTICATED by a
# cluster with token authentication when the token is missing or wrong.
_RAY_PROBES = {"gcs": ("/ray.rpc.NodeInfoGcsService/GetClusterId", b""),
               "client": ("/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06")}
_TOKEN_HELP = ("set RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head prints it), or "
               "RAY_AUTH_TOKEN_PATH to a file holding it, or put it in ~/.ray/auth_token")


def ray_token() -> tuple[str | None, str]:
    """The token Ray would send to a cluster, as Ray looks for it (RAY_AUTH_TOKEN, else the file
    RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token; surrounding whitespace dropped), and where
    it came from; (None, what was looked at) when there is none or RAY_AUTH_MODE turns tokens off.
    Only a regular file is read, and at most 64 KiB of it."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        return None, f"RAY_AUTH_MODE={mode} is set here, so no token is sent"
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = named or str(Path.home() / ".ray" / "auth_token")
    where = f"RAY_AUTH_TOKEN_PATH ({path})" if named else path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None, f"no token was found (RAY_AUTH_TOKEN is unset and {where} does not exist)"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, f"no token was found ({where} is not a regular file)"
        token = os.read(fd, 65536).decode(errors="replace").strip()
    except OSError as err:
        return None, f"no token was found ({where} cannot be read: {err.strerror or err})"
    finally:
        os.close(fd)
    return (token, where) if token else (None, f"no token was found ({where} is empty)")


def _check_token_accepted(address: str, host: str, port: str) -> None:
    """Ask the cluster, with the token Ray would send (or none), for something any member may ask:
    a cluster with token authentication refuses at once a missing or wrong token, which Ray
    itself retries for 30-40 s before a message that does not name the token."""
    try:
        import grpc
    except ImportError:
        return
    token, where = ray_token()  # what ray.init will send (use_ray_token turns sending on where a token is at hand)
    method, request = _RAY_PROBES["client" if address.startswith("ray://") else "gcs"]
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        channel.unary_unary(method)(request, timeout=PROBE_S,
                                    metadata=[("authorization", f"Bearer {token}")] if token else None)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAUTHENTICATED:
            return  # anything else is for ray.init to meet and report
        if token:
            raise ConfigError(f"--address {address}: the Ray cluster refused the token from {where} (it uses token "
                              f"authentication with another token); {_TOKEN_HELP}") from None
        mode_off = os.environ.get("RAY_AUTH_MODE", "token").lower() != "token"
        raise ConfigError(f"--address {address}: the Ray cluster uses token authentication and {where}; "
                          + ("unset RAY_AUTH_MODE (or set it to token) and " if mode_off else "")
                          + _TOKEN_HELP) from None
    finally:
        channel.close()


def use_ray_token() -> bool:
    """Send Ray's authentication token to a cluster when one is at hand: Ray 2.60 turns token
    authentication on at `ray start --head` where ~/.ray/auth_token exists, yet sends no token to
    an address given explicitly unless RAY_AUTH_MODE=token. Sets RAY_AUTH_MODE=token (for this
    process and its Ray workers) when it is unset and RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token holds a token; returns whether a token is sent. A cluster without token
    authentication ignores a token sent to it."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    if ray_token()[0] is None:
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    with contextlib.suppress(Exception):  # Ray caches its config at import; read the mode again, as Ray does
        from ray._raylet import Config

        Config.initialize("")
    return True


def _connect_ray(ray: Any, address: str, **options: Any) -> None:
    """ray.init to a cluster, its failures as ConfigError: a cluster that wants a token we do not
    have, or one that does not let us in."""
    token = use_ray_token()
    try:
        ray.init(address=address, **options)
    except Exception as err:  # noqa: BLE001 (Ray's errors for a refused connection vary by version and address form)
        if token:
            hint = "the token sent (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) may not be the cluster's"
        else:
            hint = ("if the cluster uses token authentication, put its token in ~/.ray/auth_token or RAY_AUTH_TOKEN "
                    "(RAY_AUTH_MODE=token is then set for you)")
        raise ConfigError(f"--address {address}: could not join the Ray cluster ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}); {hint}") from None


def run_ray(jobs: dict[str, tuple[dict, str]], workers: int, address: str | None,
             record: Callable[[CellResult], None]) -> None:
    """Each cell a Ray task with one CPU, and a share of a GPU where the cluster has GPUs
    (`gpu_share`; Ray hides the GPUs from a task that asks for none, so its `auto` device is
    then the CPU). Without an address, a local Ray instance with `workers` CPUs (and the
    machine's GPUs) is started, and stopped again. Run folders must be on a filesystem that
    every Ray node sees."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'interp-workbench[ray]'") from None
    started_here = not ray.is_initialized()
    common = {"log_to_driver": False, "configure_logging": False,
              "runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(_import_roots()), **_passed_env()}}}
    if started_here and address:
        _connect_ray(ray, check_ray_address(address), **common)
    elif started_here:
        ray.init(num_cpus=workers, include_dashboard=False, **common)
    try:
        gpus = gpu_share(ray.cluster_resources().get("GPU", 0), workers)
        remote = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(_ray_cell)
        driver = (os.getpid(), machine_key())
        refs = {remote.remote(driver, name, *job): name for name, job in jobs.items()}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                record(ray.get(done[0]))
            except Exception as err:  # the task's process died; train_cell itself never raises
                record(CellResult(refs[done[0]], "failed", error=f"ray task lost: {type(err).__name__}: {err}"))
    finally:
        if started_here:
            ray.shutdown()


def _passed_env() -> dict[str, str]:
    """Settings of this process that its Ray cells must see too (the memory check's override)."""
    from models.memory import SKIP_ENV

    return {SKIP_ENV: os.environ[SKIP_ENV]} if SKIP_ENV in os.environ else {}


def gpu_share(gpus: float, workers: int) -> float:
    """The GPUs each Ray cell asks for: none without GPUs; else the cluster's GPUs split among
    the `workers` cells that run at once, at most one each (Ray's fractional GPUs: two cells
    on one GPU ask for 0.5 each)."""
    if gpus <= 0:
        return 0
    return min(1.0, gpus / workers)


def _import_roots() -> list[str]:
    """The folder holding this package, so Ray workers import the same code."""
    return [str(Path(__file__).resolve().parents[2])]
