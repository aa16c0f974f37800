"""`workbench report`: (re)write a run's report.html, or a sweep folder's page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analyses.cli.common import EXIT_CONFIG


def add_parser(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="(re)write report.html of a trained run, or the page of a sweep",
                            description="A run folder: (re)write its report.html. A sweep folder (sweep.json, or "
                                        "sweep_plan.json while it runs): write its page, report.html and "
                                        "sweep_page.json, the grid coloured by verdict with links to every run.")
    report.add_argument("run_dir", type=Path, help="a run folder or a sweep folder")
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interp.run_report import write_run_report
    from interp.sweep_cells import is_sweep_folder
    from models.runs import CONFIG, load_run, run_lock
    from models.safe_files import present
    from tasks import ConfigError

    if not args.run_dir.is_dir():
        raise ConfigError(f"{args.run_dir} is not a run folder; train one first (workbench train --out {args.run_dir})")
    if is_sweep_folder(args.run_dir) and not (args.run_dir / CONFIG).exists():
        return _report_sweep(args.run_dir)
    if not present(args.run_dir / CONFIG):
        raise ConfigError(f"{args.run_dir} is neither a run folder (it has no config.json) nor a sweep folder (no "
                          "sweep.json or sweep_plan.json); give a folder written by `workbench train` or "
                          "`workbench sweep`")
    with run_lock(args.run_dir):  # a folder in training is refused, naming the trainer
        path = write_run_report(load_run(args.run_dir))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def _report_sweep(folder: Path) -> int:
    """The sweep's page, written again (its own report.html and sweep_page.json only: no run is
    locked or written, so a sweep in progress can be looked at); exit 2 naming a damaged cell."""
    from interp.sweep_page import write_sweep_page

    page, html_path, json_path = write_sweep_page(folder)
    counts = ", ".join(f"{n} {status}" for status, n in page["counts"].items())
    print(f"wrote {html_path} and {json_path} ({len(page['cells'])} cells: {counts})")
    if page["damaged"]:
        first = page["damaged"][0]
        more = (f" (and {len(page['damaged']) - 1} more damaged cell(s), listed on the page)"
                if len(page["damaged"]) > 1 else "")
        print(f"workbench report: configuration error: cell {first['cell']} is damaged: {first['error']}{more}",
              file=sys.stderr)
        return EXIT_CONFIG
    return 0
