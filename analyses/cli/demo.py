"""`workbench demo`: the quick start, every part of a report in minutes. Trains the quick-start
preset (a task registers it: a learned model with snapshots) for DEMO_SETTINGS' shorter schedule
into a new or empty folder, or over a run of its own; analyses it and its snapshots (`workbench
analyze`, then `--timeline`; a run that kept no snapshots has no timeline) and writes its report
once, at the end; and, beside it, analyses the zoo's learned three-hop LEGO model
(analyses/zoo.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from analyses.cli.analyze import run as analyze
from analyses.cli.common import add_run_options, resolve_config, train_run

# The demo's schedule, shorter than the preset's: composite-cpu learns the seen pairs by step 600 as well, and a
# timeline of 12 snapshots shows the change (docs/training.md has the numbers). A --set of the same key wins.
DEMO_SETTINGS = ["train.steps=600", "train.snapshots=12"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="train the quick-start preset's model (600 steps, 12 snapshots), analyse it "
                                       "and its timeline, write its report (the quick start)")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default: runs/demo)")
    demo.add_argument("--no-learned", action="store_true",
                      help="do not analyze the zoo's learned three-hop LEGO model into OUT-learned beside the demo")
    add_run_options(demo)
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from analyses.zoo import demo_learned
    from models.runs import DEMO, LOCK, RUN_FILES, SNAPSHOTS, atomic_write_bytes, run_lock
    from models.snapshots import remove_snapshots

    cfg = demo_config(args)
    started = time.perf_counter()
    check_demo_folder(args.out)
    with run_lock(args.out):  # nobody else writes the folder while the demo empties and retrains it
        check_demo_folder(args.out)  # again under the lock: a run written meanwhile is not deleted
        for path in args.out.iterdir():  # the demo starts fresh, but deletes only a run folder's own files
            if path.name == SNAPSHOTS:
                remove_snapshots(args.out)
            elif path.name in RUN_FILES and path.name != LOCK:
                path.unlink()
        atomic_write_bytes(args.out / DEMO, json.dumps({"config": cfg.to_dict()}, indent=1).encode())
        status = train_run(cfg, args.out, resume=False, progress=not args.no_progress)
    if status == 0:
        # the analysis (verdict, heads, circuit), then the solution through training (where snapshots were kept);
        # the report is written once, by the last
        timelines = [False, True] if (args.out / SNAPSHOTS).is_dir() else [False]
        for timeline in timelines:
            last = timeline == timelines[-1]
            analyze(argparse.Namespace(run_dir=args.out, samples=512, seed=0, device="cpu", timeline=timeline,
                                       report=last, no_progress=args.no_progress))
        learned = None if args.no_learned else demo_learned(args.out, analyze=analyze)
        print(f"demo finished in {time.perf_counter() - started:.0f} s; open {args.out / 'report.html'} in a browser"
              + (f" (and {learned / 'report.html'}, a LEGO model that learned three hops)" if learned else ""))
    return status


def demo_config(args: argparse.Namespace):
    """The quick-start preset with DEMO_SETTINGS, then the command's own settings (--set, --device)."""
    from models.presets import get_preset, quick_start_preset

    preset = quick_start_preset()
    return resolve_config(argparse.Namespace(**{**vars(args), "overrides": [*DEMO_SETTINGS, *args.overrides]}),
                          preset, get_preset(preset).task.name)


def check_demo_folder(out: Path) -> None:
    """The demo trains into a new or empty folder, or replaces a run of its own (`_is_demo_run`);
    any other run is refused, never deleted."""
    from models.run_folder import RunFolder
    from models.runs import DEMO, RUN_FILES
    from models.safe_files import is_own_temp
    from tasks import ConfigError

    if not _is_demo_run(out):
        folder = RunFolder(out, named_by="--out")
        folder.check_usable()
        if folder.holds_run():
            raise ConfigError(f"--out {out} holds a run that is not a demo run (no {DEMO} recording its config); the "
                              f"demo replaces only its own runs: choose another folder, or delete that run yourself")
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in RUN_FILES and not is_own_temp(p.name))
    if others:
        raise ConfigError(f"--out {out} holds files that are not a run's ({', '.join(others[:5])}); choose a new or "
                          "empty folder")


def _is_demo_run(out: Path) -> bool:
    """Whether `out` holds a run the demo wrote: its demo.json records the config that its
    config.json holds (or the demo stopped before writing config.json)."""
    from models.runs import CONFIG, DEMO, read_config, read_json
    from tasks import ConfigError

    try:
        recorded = read_json(out / DEMO)
        return not (out / CONFIG).exists() or read_config(out).to_dict() == recorded["config"]
    except (OSError, ValueError, TypeError, KeyError, ConfigError):  # no marker, or a damaged one or config
        return False
