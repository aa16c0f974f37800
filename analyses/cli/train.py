"""`workbench train`: one model into a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyses.cli.common import add_run_options, resolve_config, train_run
from analyses.cli.report import run as write_report


def add_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train one model into a run folder", description=_TRAIN_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--task", help="task, one of the registered ones (tasks/*.py; default: the preset's)")
    train.add_argument("--preset", help="named configuration (default: the task's own, e.g. lego-cpu); "
                                        "see `workbench presets`")
    train.add_argument("--config", type=Path, metavar="FILE",
                       help="a run configuration as JSON (task, model and train sections, e.g. another run's "
                            "config.json) instead of a preset; --set applies on top")
    train.add_argument("--out", required=True, type=Path, help="run folder to write")
    add_run_options(train)
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--from", dest="source", metavar="RUN@STEP",
                       help="replay: a new run in --out from the training state RUN kept at STEP (its states/), "
                            "with RUN's config and any --set on top")
    train.add_argument("--report", action="store_true", help="also write report.html when training ends")
    train.set_defaults(run=run)


_TRAIN_HELP = """Train one model into a run folder (config.json, model.safetensors, train_state.safetensors,
metrics.jsonl). Examples:
  workbench train --task lego --preset lego-cpu --out runs/lego1
  workbench train --preset composite-cpu --out runs/c1 --set model.init_gamma=0.3 --set train.seed=1
  workbench train --out runs/lego1 --resume        # continue a killed run
  workbench train --from runs/c1@2000 --out runs/c1-f64 --set train.loss_dtype=float64   # replay with a change"""


def run(args: argparse.Namespace) -> int:
    from models.run_folder import RunFolder
    from models.runs import CONFIG, read_config
    from tasks import ConfigError

    folder = RunFolder(args.out, named_by="--out")
    if args.source:
        return replay(args, folder)
    if args.resume:  # a config without a train state (a crash before the first checkpoint) restarts at step 0
        if not folder.holds_run():
            raise ConfigError(f"--resume: {args.out} has no {CONFIG}; there is nothing to resume")
        if args.preset or args.task or args.overrides or args.config:
            raise ConfigError("--resume continues the stored config.json; drop --preset/--task/--config/--set")
        cfg = read_config(args.out)
    else:
        cfg = resolve_config(args, args.preset, args.task)
        folder.check_usable()
        folder.check_receives()  # before training; the trainer asks again under the folder's lock
    status = train_run(cfg, args.out, args.resume, progress=not args.no_progress)
    if status == 0 and args.report:
        write_report(argparse.Namespace(run_dir=args.out))
    return status


def replay(args: argparse.Namespace, folder) -> int:
    """`--from RUN@STEP`: fork RUN at STEP into --out (models/run_folder.py, `fork_run`), then
    train the fork from there."""
    import json

    from models.run_folder import fork_run
    from models.runs import read_config
    from tasks import ConfigError

    run, _, step = args.source.rpartition("@")
    if not run or not step.isdigit():
        raise ConfigError(f"--from {args.source!r}: write RUN@STEP, e.g. runs/c1@2000")
    if args.resume or args.preset or args.task or args.config:
        raise ConfigError("--from takes the source run's config; drop --resume/--preset/--task/--config "
                          "(--set applies)")
    overrides = list(args.overrides) + ([f"train.device={json.dumps(args.device)}"] if args.device else [])
    cfg = read_config(Path(run)).with_overrides(overrides)
    folder.check_usable()
    fork_run(Path(run), int(step), folder, cfg)
    status = train_run(cfg, args.out, True, progress=not args.no_progress)
    if status == 0 and args.report:
        write_report(argparse.Namespace(run_dir=args.out))
    return status
