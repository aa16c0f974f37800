"""`workbench curriculum`: a recipe trained in stages (models/curriculum.py), each stage starting
from the last one's weights; the tasks declare the curricula."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    curriculum = sub.add_parser("curriculum", help="train a recipe in stages, each starting from the "
                                                   "last one's weights",
                                description="Train every stage of a curriculum into OUT/<stage> (resumably: a "
                                            "finished stage is kept, a partial one continues). Nothing is planted "
                                            "or mimicked; each stage starts from the weights of the one before it. "
                                            "Example: workbench curriculum lego-three-hops-albert --out runs/albert "
                                            "--set train.seed=1")
    curriculum.add_argument("name", nargs="?", help="the curriculum, e.g. lego-three-hops")
    curriculum.add_argument("--list", action="store_true", help="list the curricula with their stages and exit")
    curriculum.add_argument("--out", type=Path, help="folder of the stages' run folders")
    curriculum.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                            help="override a value in every stage, e.g. --set train.seed=1 (repeatable)")
    curriculum.add_argument("--no-progress", action="store_true", help="no progress bars")
    curriculum.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from models.curriculum import all_curricula, get_curriculum, train_curriculum
    from tasks import ConfigError

    if args.list:
        for c in all_curricula().values():
            print(f"{c.name}: {c.about}\n  preset {c.preset}, every stage: {' '.join(c.common)}")
            for stage in c.stages:
                print(f"  {stage.name}: {' '.join(stage.overrides)}")
        return 0
    if not args.name or args.out is None:
        raise ConfigError("name a curriculum and its folder: workbench curriculum NAME --out DIR "
                          "(workbench curriculum --list names them)")
    curriculum = get_curriculum(args.name)
    curriculum.configs(curriculum.folders(args.out), args.overrides)  # a bad --set is refused before anything trains
    started = time.perf_counter()
    results = train_curriculum(curriculum, args.out, args.overrides, progress=not args.no_progress)
    for r in results:
        shown = ""
        if curriculum.shown:  # what the task's curriculum shows of each stage, e.g. its per-variable accuracy
            key, words = curriculum.shown
            shown = f"  {words}: " + " ".join(f"{a:.3f}" for a in r.final.get(key, []))
        print(f"{r.name:18s} {r.state:8s} {r.seconds:7.0f} s  step {r.final.get('step')}{shown}")
    print(f"curriculum {curriculum.name}: {sum(r.seconds for r in results):.0f} s of training over "
          f"{len(results)} stages ({time.perf_counter() - started:.0f} s in this call) -> {args.out}")
    return 0
