"""`workbench benchmark`: task generation rate, training throughput and FLOP/s, or (one option
each) patching, a device, snapshots; the measurements themselves are in analyses/bench/."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("benchmark", help="task generation rate, training throughput and FLOP/s vs a matmul peak")
    bench.add_argument("--quick", action="store_true", help="shorter measurements at a batch of 16 "
                       "(for tests: the numbers are not lego-cpu's)")
    bench.add_argument("--patching", type=Path, metavar="RUN_DIR",
                       help="instead: exact vs TransformerLens vs attribution patching on this trained run")
    bench.add_argument("--label-index", type=int, default=0, help="with --patching: the label slot the metric reads")
    bench.add_argument("--device", choices=["cpu", "cuda"],
                       help="instead: the lego-gpu shape on this device (steps/s, fraction of a bf16 matmul peak, data "
                            "vs step time, patching vs TransformerLens)")
    bench.add_argument("--snapshots", action="store_true",
                       help="instead: training time and disk with the default snapshots against none (lego-cpu, "
                            "composite-matched), side by side")
    bench.add_argument("--ensemble", type=int, metavar="K",
                       help="instead: one run's step eager and compiled against K runs as one compiled ensemble, "
                            "per shape (with --device cuda the GPU shapes too)")
    bench.add_argument("--shapes", metavar="PRESET,...",
                       help="with --ensemble: only these shapes (composite-matched, lego-cpu, composite-paper, "
                            "lego-gpu)")
    bench.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tasks import ConfigError

    if args.ensemble is not None:
        from analyses.bench.ensemble import run_ensemble_benchmark

        shapes = args.shapes.split(",") if args.shapes else None
        run_ensemble_benchmark(args.ensemble, args.device or "cpu", quick=args.quick, only=shapes)
        return 0
    if args.snapshots:
        from analyses.bench.snapshots import run_snapshot_benchmark

        run_snapshot_benchmark(quick=args.quick)
        return 0
    if args.patching and args.device:
        from analyses.bench.throughput import DEVICE_PRESET

        raise ConfigError(f"--patching times the run's own model on the CPU; drop --device {args.device} "
                          f"(--device alone times the same sweep on a fresh {DEVICE_PRESET} model on that device)")
    if args.patching:
        from analyses.bench.patching import agreement_at_init, print_report, run_patching_benchmark
        from models.runs import load_run

        loaded = load_run(args.patching)
        repeats = 1 if args.quick else 3
        results = run_patching_benchmark(loaded.model, loaded.task, repeats=repeats, label_index=args.label_index)
        print_report({**results, **agreement_at_init(loaded, 32, 0, args.label_index)})
        return 0
    from analyses.bench.throughput import run_benchmarks, run_device_benchmark
    from models.device import resolve_device

    if args.device:
        run_device_benchmark(resolve_device(args.device, setting="benchmark --device"), quick=args.quick)
        return 0
    run_benchmarks(quick=args.quick)
    return 0
