"""`workbench circuit-export` and `workbench circuit-compare`: a run's circuit as MIB circuit
files (interp/mib.py), and how much two circuits share (interp/circuit_compare.py).
docs/analysis.md, "Circuits others can read"."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_EXPORT_HELP = """Find the run's circuit as `workbench analyze` does (same pairs and seed, so the same heads and
edges as its analysis.json on the CPU) and write it in the file format of MIB's circuit track:
OUT/circuit.json (the circuit, with every head's exact patching effect and every head edge's
path patching effect as scores) and OUT/edges-<P>pct.json for each of MIB's edge budgets (every
head kept, the strongest P% of the scored edges). Reads the run folder; writes only OUT."""

_COMPARE_HELP = """How much two circuits share: heads and edges, by name and by layer (heads of a layer
have no identity across seeds), for the circuits and at each of MIB's edge budgets. A and B are
run folders (their circuit is found as circuit-export finds it), folders written by
circuit-export, or MIB circuit files (.json). Nothing is written unless --out is given."""


def add_parser(sub: Any) -> None:
    """The two subcommands, added to the `workbench` parser's subparsers."""
    export = sub.add_parser("circuit-export", help="write a run's circuit as MIB circuit files (circuit.json, one "
                            "per MIB edge budget)", description=_EXPORT_HELP)
    export.add_argument("run_dir", type=Path)
    export.add_argument("--out", required=True, type=Path, help="folder for the files (created)")
    _add_pair_options(export)
    export.set_defaults(run=_cmd_export)
    compare = sub.add_parser("circuit-compare", help="heads and edges two circuits share (two seeds, two runs)",
                             description=_COMPARE_HELP)
    compare.add_argument("a", type=Path, help="run folder, circuit-export folder or MIB circuit file")
    compare.add_argument("b", type=Path, help="the same, for the other circuit")
    compare.add_argument("--out", type=Path, metavar="FILE.json",
                         help="also write the comparison there as JSON (its folder is made)")
    _add_pair_options(compare)
    compare.set_defaults(run=_cmd_compare)


def _add_pair_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", type=int, default=64, help="counterfactual pairs the circuit is found on "
                                                         "(default 64, as analyze)")
    p.add_argument("--seed", type=int, default=0, help="seed of the pairs (default 0, as analyze)")
    p.add_argument("--no-edges", action="store_true", help="heads only, no path patching (fast on deep models): no "
                                                           "edge scores, every edge between kept heads in the circuit")


def _measured_files(run_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from interp.circuit_compare import measure_run_circuit, mib_files
    from models.runs import load_run
    from tasks import ConfigError

    if args.pairs < 2:
        raise ConfigError(f"--pairs {args.pairs}: give 2 or more pairs")
    run = load_run(run_dir)
    measured, description = measure_run_circuit(run, args.pairs, args.seed, edges=not args.no_edges)
    meta = {"run": str(run_dir), "task": run.config.task.name, "pairs": description, "n_pairs": args.pairs,
            "seed": args.seed, "edges_scored": bool(measured.edge_scores),
            "weights": None if run.weights is None else dict(run.weights.to_dict())}
    try:
        return mib_files(measured, meta)
    except ValueError as err:
        raise ConfigError(f"{run_dir}: {err}") from None


def _cmd_export(args: argparse.Namespace) -> int:
    from interp.mib import write_mib
    from models.run_folder import RunFolder

    RunFolder(args.out, named_by="--out").check_place("the circuit files")  # before the measurement
    files = _measured_files(args.run_dir, args)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_mib(args.out / name, data)
    meta = files["circuit.json"]["meta"]
    size = (args.out / "circuit.json").stat().st_size
    print(f"{args.run_dir}: {meta['heads_in_graph']} heads and {meta['scored_edges_in_graph']} scored edges in the "
          f"circuit (faithfulness {meta['faithfulness']}); MIB graph of {meta['nodes']} nodes and {meta['edges']} "
          f"edges ({meta['unscored_edges']} unscored: from the input or MLPs, or into MLPs)")
    budgets = f"{len(files) - 1} edge-budget files" if len(files) > 1 else "no edge-budget files (no edge scores)"
    print(f"wrote {args.out / 'circuit.json'} ({size / 1024:.1f} KiB) and {budgets} in {args.out}")
    return 0


def _circuit_of(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A MIB file from a run folder (measured), a circuit-export folder or a file."""
    from interp.mib import read_mib
    from tasks import ConfigError

    if path.is_dir() and (path / "model.safetensors").exists():
        return _measured_files(path, args)["circuit.json"]
    target = path / "circuit.json" if path.is_dir() else path
    if not target.is_file():
        raise ConfigError(f"{path} is neither a run folder with model.safetensors, a circuit-export folder "
                          f"(circuit.json) nor a MIB circuit file")
    try:
        return read_mib(target)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_out_file(out: Path) -> None:
    """--out FILE.json, checked before the circuits are measured: not a folder, and its folder made."""
    from tasks import ConfigError

    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name a file for the comparison, e.g. {out / 'comparison.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: its folder cannot be made ({err.strerror}); choose one you can write") \
            from None


def _cmd_compare(args: argparse.Namespace) -> int:
    from interp.circuit_compare import compare_circuits, comparison_lines
    from tasks import ConfigError

    if args.out is not None:
        _check_out_file(args.out)
    a, b = (_circuit_of(path, args) for path in (args.a, args.b))
    try:
        result = compare_circuits(a, b)
    except ValueError as err:
        raise ConfigError(f"{args.a} and {args.b}: {err}") from None
    print(f"A = {args.a}\nB = {args.b}\n(shared/|A|+|B|, Jaccard)")
    print("\n".join(comparison_lines(result)))
    if args.out is not None:
        from models.runs import atomic_write_bytes

        result = {"a": str(args.a), "b": str(args.b), **result}
        atomic_write_bytes(args.out, json.dumps(result, indent=1, allow_nan=False).encode())
        print(f"wrote {args.out}")
    return 0
