"""`workbench sweep`: a grid of configs on top of a preset, one run folder per cell (analyses/runners/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analyses.cli.common import EXIT_CONFIG, add_ensemble_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="train a grid of configs (many run folders, sweep.json, one report)",
                           description=_SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("--preset", required=True, help="the base configuration; see `workbench presets`")
    sweep.add_argument("--grid", nargs="+", required=True, metavar="SECTION.KEY=V1,V2",
                       help="the values each key takes; the sweep trains every combination")
    sweep.add_argument("--out", required=True, type=Path, help="sweep folder (one run folder per cell inside)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a base config value for every cell (repeatable)")
    sweep.add_argument("--workers", type=int, help="cells trained at once (default: one per core)")
    sweep.add_argument("--backend", choices=["local", "ray"], default="local", help="where cells run (default local)")
    sweep.add_argument("--address", help="with --backend ray: the cluster address (default: a local Ray instance)")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_ensemble_argument(sweep)
    sweep.set_defaults(run=run)


_SWEEP_HELP = """Train every combination of the --grid values on top of a preset. Each cell is an ordinary
run folder under --out (named like init_gamma=0.3__n_layers=2__seed=0), next to sweep.json (the
index: grid, status, wall time and final metrics per cell) and report.html. Re-running the same
command skips finished (and diverged) cells, resumes killed ones and retries failed ones.
Exit status 1 when some cell failed or its folder was busy (re-run to retry), 2 when a cell's folder
holds a damaged file or another run (a re-run cannot fix it: the message names the file). Killed
in any way, the sweep's workers die with it (Linux), and the same command resumes it. Example:
  workbench sweep --preset composite-cpu --grid model.init_gamma=0.3,0.5 model.n_layers=2,3 \\
      train.seed=0,1 --out runs/sweeps/x"""


def run(args: argparse.Namespace) -> int:
    from analyses.runners.ray_backend import check_ray_address
    from analyses.runners.sweep import grid_cells, machine_cores, parse_grid, run_sweep
    from models.presets import get_preset
    from models.runs import run_lock
    from tasks import ConfigError

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be >= 1")
    if args.address and args.backend != "ray":
        raise ConfigError("--address needs --backend ray")
    base = get_preset(args.preset).with_overrides(args.overrides)
    grid = parse_grid(args.grid)
    cells = grid_cells(base, grid)  # every cell's config is valid before the folder is made (and locked)
    if not args.address:  # cells on this machine: they must fit in its memory, `workers` at once
        _check_cells_memory(cells, min(len(cells), args.workers or machine_cores()))
    if args.address:
        check_ray_address(args.address)  # so is the cluster's address (within seconds)
    # one sweep per folder: a second one exits 2 at once, naming the first, and changes nothing
    with run_lock(args.out):
        index = run_sweep(base, grid, args.out, preset=args.preset, workers=args.workers,
                          backend=args.backend, address=args.address, progress=not args.no_progress,
                          ensemble=args.ensemble)
    print(f"sweep of {len(index['cells'])} cells: {json.dumps(index['counts'])} in {index['wall_seconds']:.0f} s; "
          f"see {args.out / 'sweep.json'} and {args.out / 'report.html'}")
    for name, cell in index["cells"].items():
        if cell.get("status") == "failed":
            print(f"workbench sweep: cell {name} failed: "
                  f"{((cell.get('error') or '').strip().splitlines() or [''])[-1]}",
                  file=sys.stderr)
    if any(cell.get("refused") for cell in index["cells"].values()):
        return EXIT_CONFIG  # a damaged cell folder: running the sweep again cannot fix it
    return 1 if index["counts"].get("failed") else 0


def _check_cells_memory(cells: dict, at_once: int) -> None:
    """Refuse a sweep whose cells, `at_once` of them training together, do not fit in memory."""
    from models.device import resolve_device
    from models.memory import check_memory
    from tasks import make_task

    for cfg in cells.values():
        check_memory(cfg, make_task(cfg.task), resolve_device(cfg.train.device), copies=at_once)
