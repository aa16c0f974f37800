"""Run many training cells, each an ordinary run folder under one root, resumably: a finished
cell is skipped, a killed one resumes from its checkpoint, a diverged or crashed one is
recorded and never stops the others.

Backends: `local` trains in this process (workers=1, with the caller's torch threads) or in a
pool of worker processes (forkserver, so no worker inherits the parent's threads or locks),
each limited to cores // workers torch threads; `ray` runs each cell as a Ray task, on a
cluster (`address`) or on a local Ray instance. A cell's result depends only on its config, so every backend
gives the same numbers for the same grid.

A sweep (`run_sweep`, `workbench sweep`) is a grid over config keys on top of a preset:
`{"model.init_gamma": [0.3, 0.5], "train.seed": [0, 1]}` gives four cells named
`init_gamma=0.3__seed=0` ...; it writes `sweep_plan.json` (the grid) when it starts, and
`sweep.json` (the index) and its page (`report.html`, `sweep_page.json`) when it ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from analyses.ensemble_runner import train_ensembles
from analyses.lifeline import die_with, dying_with, machine_key, watched_pid
from models.config import RunConfig, parse_value
from models.runs import (
    CONFIG,
    RunFolderError,
    atomic_write_bytes,
    read_config,
    read_json,
    read_metrics,
    run_state,
    same_recipe,
)
from models.safe_files import FolderBusy, run_lock
from tasks import ConfigError

BACKENDS = ("local", "ray")
INDEX, PLAN, CELLS_INDEX = "sweep.json", "sweep_plan.json", "cells.json"
CellFn = Callable[[str, dict[str, Any], str], "CellResult"]
LOCK_GRACE_S = 10.0  # how long a cell waits for its folder's lock (a killed sweep's worker dies in ~1 s)


@dataclass
class CellResult:
    """What one cell ended as: `done`, `diverged` (the loss became NaN/inf) or `failed` (crashed,
    or `refused`: its folder holds a damaged file or another run, which a re-run cannot fix)."""

    name: str
    status: str
    final: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    refused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_cell(name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """Train (or resume, or skip) one cell. Module-level and picklable, so any backend can call it.
    The cell's folder is locked first, waiting up to LOCK_GRACE_S for a worker of a killed sweep
    to die; a folder still busy after that is `failed` (a re-run retries it), not refused."""
    try:
        with run_lock(run_dir, wait=LOCK_GRACE_S):
            return _train_locked_cell(name, RunConfig.from_dict(cfg_dict), Path(run_dir))
    except FolderBusy as err:
        return CellResult(name, "failed", error=f"{err}; re-run the sweep once it has finished")


def _train_locked_cell(name: str, cfg: RunConfig, path: Path) -> CellResult:
    """`train_cell` under the cell's lock."""
    from models.train import Trainer, TrainingDiverged

    try:  # a cell folder with a damaged config or metrics is recorded as failed, naming the file
        if (path / CONFIG).exists() and not same_recipe(read_config(path), cfg):
            return CellResult(name, "failed", error=f"{path} holds a run with another config; move it away", refused=True)
        state = run_state(path, cfg)
        if state in ("done", "diverged"):
            metrics = read_metrics(path)
            return CellResult(name, state, metrics[-1], float(metrics[-1].get("elapsed_s", 0.0)))
    except RunFolderError as err:
        return CellResult(name, "failed", error=str(err), refused=True)
    started = time.perf_counter()
    try:
        result = Trainer(cfg, path, resume=state == "partial", progress=False).fit()
    except RunFolderError as err:
        return CellResult(name, "failed", seconds=time.perf_counter() - started, error=str(err), refused=True)
    except TrainingDiverged as err:
        return CellResult(name, "diverged", read_metrics(path)[-1], time.perf_counter() - started, str(err))
    except Exception:  # a crashed cell is recorded, the sweep goes on
        return CellResult(name, "failed", seconds=time.perf_counter() - started, error=traceback.format_exc(limit=5))
    return CellResult(name, "done", result.final, result.seconds)


# ---------------------------------------------------------------------------------------------
# Running cells on a backend


def machine_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by WORKBENCH_THREADS when set
    (`/work/bin/cpu-slot`-style wrappers grant one core that way)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    granted = os.environ.get("WORKBENCH_THREADS")
    return max(1, min(cores, int(granted))) if granted and granted.isdigit() else cores


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of `workers` parallel cells, so that workers x threads <= cores."""
    return max(1, machine_cores() // workers)


def run_cells(cells: dict[str, RunConfig], root: str | Path, *, workers: int | None = 1, backend: str = "local",
              address: str | None = None, progress: bool = True, ensemble: str = "auto") -> dict[str, CellResult]:
    """Train every cell into `root/<name>` and return their results by name (in `cells` order).

    workers: cells trained at once (None: one per core). Finished and diverged cells are
    skipped, partial ones resume, failed ones are retried. `root/cells.json` is updated as each
    cell ends, so a killed sweep leaves an index of what it finished; it keeps the entries of
    earlier calls on the same root (a pool several studies fill) whose folders still exist.
    ensemble: auto|on|off, whether same-shape cells train as one ensemble in this process
    (analyses/ensemble_runner.py; local backend only), before the cells left train as above.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is unknown; use one of {BACKENDS}")
    if address is not None and backend != "ray":
        raise ConfigError(f"an address ({address}) only applies to --backend ray")
    workers = machine_cores() if workers is None else workers
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    root = Path(root)
    jobs = {name: (cfg.to_dict(), str(check_cell_folder(root, name))) for name, cfg in cells.items()}
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, CellResult] = {}
    bar = tqdm(total=len(jobs), desc=f"cells of {root.name}", disable=not progress, unit="cell",
               mininterval=1.0 if _is_tty() else 30.0)

    def record(result: CellResult) -> None:
        results[result.name] = result
        bar.update(1)
        bar.set_postfix(_status_counts(results.values()))
        _update_index(root / CELLS_INDEX, {k: results[k].to_dict() for k in jobs if k in results})

    left = jobs if backend == "ray" else train_ensembles(jobs, ensemble, record, progress)
    if backend == "ray":
        _run_ray(jobs, workers, address, record)
    elif workers == 1:  # in this process, with the caller's torch threads
        for name, (cfg_dict, run_dir) in left.items():
            record(train_cell(name, cfg_dict, run_dir))
    elif left:
        _run_pool(left, workers, record)
    bar.close()
    return {name: results[name] for name in jobs}


def _run_pool(jobs: dict[str, tuple[dict, str]], workers: int, record: Callable[[CellResult], None],
              cell_fn: CellFn = train_cell) -> None:
    """A process pool over the jobs. A worker that dies (segfault, out of memory) breaks the pool
    and every cell running beside it; those cells are then retried one per fresh process, so
    only the culprit ends `failed`."""
    broken = _pool_round(jobs, workers, record, cell_fn)
    for name in broken:
        if _pool_round({name: jobs[name]}, 1, record, cell_fn):
            record(CellResult(name, "failed", error="the worker process died (killed, out of memory or crashed)"))


def _pool_round(jobs: dict[str, tuple[dict, str]], workers: int, record: Callable[[CellResult], None],
                cell_fn: CellFn) -> list[str]:
    """Run the jobs in one pool; return the names of those lost to a broken pool."""
    threads = threads_per_worker(workers)
    context = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
    lost: list[str] = []
    # every worker dies with this process, however it ends (analyses/lifeline.py)
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)) or 1, mp_context=context,
                               initializer=die_with, initargs=(os.getpid(),))
    try:
        with _stop_signals_raise():
            futures = {pool.submit(_call_with_threads, cell_fn, threads, name, *job): name for name, job in jobs.items()}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    try:
                        record(future.result())
                    except BrokenProcessPool:
                        lost.append(futures[future])
    except BaseException:  # killed (SIGTERM, Ctrl-C) or crashed: no worker may train on unwatched
        _stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [name for name in jobs if name in lost]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # `kill PID`; a closed terminal or a lost ssh session


@contextlib.contextmanager
def _stop_signals_raise():
    """While inside, SIGTERM (`kill PID`) and SIGHUP (the terminal closed) raise
    SystemExit(128 + signal) in the main thread, as Ctrl-C raises KeyboardInterrupt, so the
    caller stops its workers before it exits. A SIGKILL cannot be caught: for it, and for any
    other death, each worker watches this process itself (analyses/lifeline.py). Elsewhere than
    the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = {signum: signal.signal(signum, terminated) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes (the executor has no public way before Python 3.14's
    terminate_workers). A cell stopped this way resumes from its last checkpoint next time."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def _call_with_threads(cell_fn: CellFn, threads: int, name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """Run one cell with `threads` torch threads (restored afterwards, in case the process
    is reused)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return cell_fn(name, cfg_dict, run_dir)
    finally:
        torch.set_num_threads(before)


def _ray_cell(driver: tuple[int, str], name: str, cfg_dict: dict[str, Any], run_dir: str) -> CellResult:
    """One cell as a Ray task, with one torch thread. On the driver's machine the Ray worker dies
    with the driver (a killed sweep leaves no cell training); on other machines Ray itself
    stops the tasks of a job whose driver has gone."""
    with dying_with(watched_pid(driver)):
        return _call_with_threads(train_cell, 1, name, cfg_dict, run_dir)


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
        raise ConfigError(f"--address {address}: nothing answers at {host}:{port} ({getattr(err, 'strerror', None) or err}); "
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


def _run_ray(jobs: dict[str, tuple[dict, str]], workers: int, address: str | None,
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
    return [str(Path(__file__).resolve().parents[1])]


def _status_counts(results: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return counts


def _is_tty() -> bool:
    return sys.stderr.isatty()


def _write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=1, default=float).encode())


def _update_index(path: Path, entries: dict[str, Any]) -> None:
    """Write `entries` into the index at `path`, keeping what is there for other cells whose
    folders still exist. It is read just before each write: two sweeps filling one pool at once
    lose an entry only when their writes interleave, and the losing sweep's next write restores it."""
    try:
        index = read_json(path)
    except (FileNotFoundError, RunFolderError):  # none yet, or damaged: the entries of this call are what counts
        index = {}
    index = index if isinstance(index, dict) else {}
    kept = {name: entry for name, entry in index.items() if name not in entries and (path.parent / name).is_dir()}
    _write_json(path, {**kept, **entries})


# ---------------------------------------------------------------------------------------------
# Grids and sweeps


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """`["model.init_gamma=0.3,0.5", "train.seed=0,1"]` -> {"model.init_gamma": [0.3, 0.5], ...};
    each value is parsed as JSON when it parses (numbers, true/false, null), else kept a string."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or "." not in key or not raw.strip():
            raise ConfigError(f"--grid {item!r} is not of the form section.key=v1,v2,...")
        if key in grid:
            raise ConfigError(f"--grid names {key} twice; give all its values in one --grid")
        grid[key] = [parse_value(v.strip(), f"--grid {key}") for v in raw.split(",")]
    return grid


def cell_name(assignment: dict[str, Any]) -> str:
    """A folder name for one grid point: `init_gamma=0.3__seed=0` (the key's last part). A value
    is one name, never a path: "/" (and "\\", and "%" itself) are percent-encoded, so that
    `train.init_from=../../x` names the folder `init_from="..%2F..%2Fx"` inside the sweep's."""
    return "__".join(f"{key.rpartition('.')[2]}={_one_name(json.dumps(value))}" for key, value in assignment.items())


def _one_name(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")


NAME_MAX = 255  # bytes in one file name (Linux, most file systems)


def check_cell_folder(root: Path, name: str) -> Path:
    """`root/name`, once checked to be one folder directly inside `root` with a name the file
    system takes; ConfigError (exit 2) naming the cell otherwise. Every cell folder is made here."""
    size = len(os.fsencode(name))
    if size > NAME_MAX:
        raise ConfigError(f"cell {name[:40]}... would be a folder name of {size} bytes, more than the file system takes "
                          f"({NAME_MAX}); use shorter grid values")
    if name in ("", ".", "..") or Path(name).name != name or os.sep in name or "\0" in name:
        raise ConfigError(f"cell name {name!r} is not one folder name inside {root}; it would be written elsewhere")
    return root / name


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, first key slowest."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def grid_cells(base: RunConfig, grid: dict[str, list[Any]]) -> dict[str, RunConfig]:
    """One validated RunConfig per grid point, by cell name."""
    short = [key.rpartition(".")[2] for key in grid]
    if len(set(short)) < len(short):
        raise ConfigError(f"--grid keys {sorted(grid)} end in the same name; cell folders would collide")
    cells = {cell_name(point): base.with_overrides([f"{k}={json.dumps(v)}" for k, v in point.items()])
             for point in grid_points(grid)}
    for name in cells:
        check_cell_folder(Path("."), name)
    return cells


def run_sweep(base: RunConfig, grid: dict[str, list[Any]], out: str | Path, *, preset: str | None = None,
              workers: int | None = None, backend: str = "local", address: str | None = None,
              progress: bool = True, ensemble: str = "auto") -> dict[str, Any]:
    """Train the grid's cells under `out` and write `out/sweep.json`, then the sweep's page
    (`out/report.html` and `out/sweep_page.json`, interp/sweep_page.py); `out/sweep_plan.json`
    (grid and cells) is written first, so a sweep in progress has a page too. Returns the index
    (what sweep.json holds)."""
    out = Path(out)
    cells = grid_cells(base, grid)
    points = {cell_name(p): p for p in grid_points(grid)}
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)  # the plan: what the sweep's page of a sweep in progress reads
    _write_json(out / PLAN, {"preset": preset, "grid": grid, "base": base.to_dict(),
                             "cells": {name: {"point": point} for name, point in points.items()}})
    results = run_cells(cells, out, workers=workers, backend=backend, address=address, progress=progress,
                        ensemble=ensemble)
    index = {
        "preset": preset, "grid": grid, "base": base.to_dict(), "backend": backend,
        "workers": machine_cores() if workers is None else workers,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "counts": _status_counts(results.values()),
        "cells": {name: {"point": points[name], **_summary(result)} for name, result in results.items()},
    }
    _write_json(out / INDEX, index)
    from interp.sweep_page import write_sweep_page  # here: the cells' worker processes import this module

    write_sweep_page(out)
    return index


def _summary(result: CellResult) -> dict[str, Any]:
    scalars = {k: v for k, v in result.final.items() if isinstance(v, int | float | str | None)}
    summary = {"status": result.status, "seconds": round(result.seconds, 2), "final": scalars, "error": result.error}
    return {**summary, "refused": True} if result.refused else summary
