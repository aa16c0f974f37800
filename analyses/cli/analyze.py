"""`workbench analyze`: look inside a trained run (heads, patching, probes, verdict), at its end
or, with --timeline, at every snapshot."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser("analyze", help="look inside a trained run: heads, patching, probes, verdict")
    analyze.add_argument("run_dir", type=Path)
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
    analyze.add_argument("--no-progress", action="store_true", help="no progress bar (with --timeline)")
    analyze.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interp.analysis import analyze_run, task_analysis, write_analysis
    from interp.run_report import write_run_report
    from models.device import resolve_device
    from models.memory import check_memory
    from models.runs import load_run, read_config, run_lock
    from tasks import ConfigError, make_task

    if not (args.run_dir / "model.safetensors").exists():
        raise ConfigError(f"{args.run_dir} holds no trained model (model.safetensors); train it first")
    device = resolve_device(args.device, setting="analyze --device")
    cfg = read_config(args.run_dir)
    try:
        check_memory(cfg, make_task(cfg.task), device, purpose="analyze", n_samples=args.samples)
    except ConfigError as err:
        raise ConfigError(f"{args.run_dir / 'config.json'}: {err}") from None
    bootstrap = getattr(args, "bootstrap", 0)
    if bootstrap and (bootstrap < 2 or getattr(args, "timeline", False)):
        raise ConfigError(f"--bootstrap {bootstrap}: give 2 or more resamples, and not with --timeline")
    if getattr(args, "timeline", False):
        return _analyze_timeline(args, device)
    # a folder in training is refused, naming the trainer; nothing it writes is overwritten
    with run_lock(args.run_dir):
        run = load_run(args.run_dir, device=device)
        analysis = analyze_run(run, n_samples=args.samples, seed=args.seed, device=device, bootstrap=bootstrap)
        json_path = write_analysis(run, analysis)
        report_path = write_run_report(run, analysis=analysis)
    print(task_analysis(analysis.task).headline(analysis.verdict))
    print(f"wrote {json_path} and {report_path} in {analysis.seconds:.0f} s on {device.type}")
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
