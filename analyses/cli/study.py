"""`workbench study`: one experiment of the papers (analyses/studies/), many runs and one summary report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from analyses.cli.common import EXIT_CONFIG, add_ensemble_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    study = sub.add_parser("study", help="run one experiment of the papers (many runs, one summary report)",
                           description="Run a study: train its cells (resumably), analyse them, write report.html "
                                       "and results.json into --out. `workbench study --list` names them all.")
    study.add_argument("name", nargs="?", help="e.g. lego-extrapolation, composite-phase, templates-efficiency")
    study.add_argument("--list", action="store_true", help="list the studies and exit")
    study.add_argument("--scale", default="cpu", help="tiny (seconds, smoke test), cpu (default, < 30 min on 2 cores), "
                                                      "gpu (one GPU, <= 10 min per model) or paper (the papers' sizes)")
    study.add_argument("--out", type=Path, help="study folder (default runs/studies/<name>-<scale>)")
    study.add_argument("--workers", type=int, default=1, help="cells trained at once (default 1)")
    study.add_argument("--backend", choices=["local", "ray"], default="local", help="where cells run (default local)")
    study.add_argument("--address", help="with --backend ray: the cluster address (default: a local Ray instance)")
    study.add_argument("--seeds", type=_seed_list, help="comma-separated training seeds replacing the study's own "
                                                         "(e.g. 0,1; default: one at cpu scale, more at paper scale)")
    study.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="composite studies: override every cell's base config, e.g. --set model.norm_position=post "
                            "(repeatable; needs --out)")
    study.add_argument("--gammas", type=_gamma_pair, metavar="SMALL,LARGE",
                       help="composite-mechanism: the two init rates to contrast (default: the scale's; the paper's "
                            "pair is 0.5,0.8)")
    study.add_argument("--protocol", help="composite studies: fast (default: lr 1e-3, biases, GELU, <= 3,000 steps) or "
                                          "matched (the composite-matched preset, the cpu protocol nearest the "
                                          "paper's: lr 1e-4, bias-free ReLU, up to 30,000 steps; hours per study, see "
                                          "docs/sweeps.md); default folder runs/studies/<name>-<scale>-matched")
    study.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_ensemble_argument(study)
    study.set_defaults(run=run)


def _seed_list(raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a comma-separated list of integers") from None


def _gamma_pair(raw: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in raw.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not two comma-separated init rates, e.g. 0.5,0.8") from None


def run(args: argparse.Namespace) -> int:
    from analyses.runners.study import all_studies, run_study
    from tasks import ConfigError

    if args.list or not args.name:
        for name, study in sorted(all_studies().items()):
            print(f"{name:28s} {study.summary}")
        return 0 if args.list else EXIT_CONFIG
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be >= 1")
    started = time.perf_counter()
    results = run_study(args.name, args.out, args.scale, workers=args.workers, backend=args.backend,
                        address=args.address, progress=not args.no_progress, seeds=args.seeds,
                        overrides=args.overrides, gammas=args.gammas, protocol=args.protocol,
                        ensemble=args.ensemble)
    print(json.dumps(results.get("headline", {}), default=str))
    print(f"study {args.name} ({args.scale}) finished in {time.perf_counter() - started:.0f} s; "
          f"see {results.get('report', 'its folder')}")
    return 0
