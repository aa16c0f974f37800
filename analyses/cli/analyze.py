"""`workbench analyze`: look inside a trained run (heads, patching, probes, verdict), at its end
or, with --timeline, at every snapshot; given a sweep folder, every finished cell of it, then the
sweep's page again."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser("analyze", help="look inside a trained run: heads, patching, probes, verdict; given a "
                                              "sweep folder, every finished cell, then the sweep's page")
    analyze.add_argument("run_dir", type=Path, help="a run folder, or a sweep folder (its cells whose analysis.json "
                                                    "did not read their current weights are analysed)")
    analyze.add_argument("--samples", type=int, default=512, help="test sentences for head scores (default 512)")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                         help="where the model and its batches run (default: cpu, whatever device trained the run, so "
                              "the numbers are the same on every machine; cuda agrees within fp32 rounding; "
                              "auto = CUDA when present)")
    analyze.add_argument("--timeline", action="store_true",
                         help="instead: the verdict, head labels, exact head patching, the circuit (nodes) and the "
                              "probes at every snapshot of the run's weights, as timeline.json and a report section")
    analyze.add_argument("--bootstrap", type=int, default=0, metavar="N",
                         help="also find the circuit again on N resamples of the pairs: intervals and the stable core "
                              "(default 0: none; each resample costs what the circuit costs)")
    analyze.add_argument("--no-progress", action="store_true", help="no progress bar (--timeline, a sweep)")
    analyze.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interp.sweep_cells import is_sweep_folder
    from interp.tasks import task_analysis
    from models.device import resolve_device
    from models.runs import CONFIG
    from tasks import ConfigError

    device = resolve_device(args.device, setting="analyze --device")
    bootstrap = getattr(args, "bootstrap", 0)
    if bootstrap and (bootstrap < 2 or getattr(args, "timeline", False)):
        raise ConfigError(f"--bootstrap {bootstrap}: give 2 or more resamples, and not with --timeline")
    if is_sweep_folder(args.run_dir) and not (args.run_dir / CONFIG).exists():
        if getattr(args, "timeline", False):
            raise ConfigError(f"--timeline analyses one run; give a cell of the sweep, e.g. {args.run_dir}/CELL")
        return _analyze_sweep(args, device)
    if not (args.run_dir / "model.safetensors").exists():
        raise ConfigError(f"{args.run_dir} holds no trained model (model.safetensors); train it first")
    if getattr(args, "timeline", False):
        _check_memory(args.run_dir, device, args.samples)
        return _analyze_timeline(args, device)
    analysis, written = _analyze_one(args.run_dir, args, device, report=getattr(args, "report", True))
    print(task_analysis(analysis.task).headline(analysis.verdict))
    print(f"wrote {' and '.join(map(str, written))} in {analysis.seconds:.0f} s on {device.type}")
    return 0


def _check_memory(run_dir: Path, device, n_samples: int) -> None:
    from models.memory import check_memory
    from models.runs import read_config
    from tasks import ConfigError, make_task

    cfg = read_config(run_dir)
    try:
        check_memory(cfg, make_task(cfg.task), device, purpose="analyze", n_samples=n_samples)
    except ConfigError as err:
        raise ConfigError(f"{run_dir / 'config.json'}: {err}") from None


def _analyze_one(run_dir: Path, args: argparse.Namespace, device, report: bool = True):
    """One run analysed: analysis.json and (with `report`) report.html written; the analysis and
    the paths written."""
    from interp.analysis import analyze_run, write_analysis
    from interp.run_report import write_run_report
    from models.runs import load_run, run_lock

    _check_memory(run_dir, device, args.samples)
    # a folder in training is refused, naming the trainer; nothing it writes is overwritten
    with run_lock(run_dir):
        run = load_run(run_dir, device=device)
        analysis = analyze_run(run, n_samples=args.samples, seed=args.seed, device=device,
                               bootstrap=getattr(args, "bootstrap", 0))
        written = [write_analysis(run, analysis)]
        if report:
            written.append(write_run_report(run, analysis=analysis))
    return analysis, written


def _analyze_sweep(args: argparse.Namespace, device) -> int:
    """Every finished cell of a sweep whose analysis.json did not read its current weights, one
    after another (a rerun skips those done), then the sweep's page written again."""
    import sys

    from tqdm import tqdm

    from interp.analysis_file import analysis_is_current
    from interp.sweep_cells import read_cells, read_sweep_index
    from interp.sweep_page import write_sweep_page

    cells = read_cells(read_sweep_index(args.run_dir))
    finished = [c.name for c in cells if c.status == "done"]
    waiting = [name for name in finished if not analysis_is_current(args.run_dir / name)]
    bar = tqdm(waiting, desc=f"analysing cells of {args.run_dir.name}", unit="cell", disable=args.no_progress,
               mininterval=1.0 if sys.stderr.isatty() else 30.0)
    for name in bar:
        bar.set_postfix(cell=name)
        _analyze_one(args.run_dir / name, args, device)
    page, html_path, _ = write_sweep_page(args.run_dir)
    print(f"analysed {len(waiting)} cell(s) ({len(finished) - len(waiting)} already analysed, "
          f"{len(cells) - len(finished)} not finished); wrote {html_path}")
    return 0

def _analyze_timeline(args: argparse.Namespace, device) -> int:
    """`analyze --timeline`: every snapshot analysed (interp/timeline.py), timeline.json and the
    report rewritten with its section. The snapshots are checked before anything is written."""
    from interp.run_report import write_run_report
    from interp.timeline import analyze_timeline, moments, write_timeline
    from models.runs import load_run, run_lock

    with run_lock(args.run_dir):
        run = load_run(args.run_dir, device=device)
        moments(run.path)  # no snapshots, or a damaged index: exit 2 before the analysis starts
        timeline = analyze_timeline(run, seed=args.seed, device=device, progress=not args.no_progress)
        path = write_timeline(run.path, timeline)
        report_path = write_run_report(run)
    summary = timeline["summary"]
    changes = ", ".join(f"{c['from']} -> {c['to']} at step {c['step']}" for c in summary["changes"]) or "none"
    print(f"{summary['final_label']}, decided at step {summary['decided_at']} ({len(timeline['points'])} moments; "
          f"changes: {changes})")
    print(f"wrote {path} and {report_path} in {timeline['seconds']:.0f} s on {device.type}")
    return 0
