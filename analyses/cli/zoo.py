"""`workbench zoo`: list the committed zoo of trained runs (analyses/zoo.py), or rebuild entries of it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    zoo = sub.add_parser("zoo", help="list the committed zoo of trained runs, or rebuild entries of it")
    zoo.add_argument("action", nargs="?", choices=["list", "build"], default="list")
    zoo.add_argument("names", nargs="*", help="entries to build (default with build: every entry)")
    zoo.add_argument("--dir", type=Path, default=None, help="zoo folder (default: the repository's zoo/)")
    zoo.add_argument("--no-progress", action="store_true")
    zoo.add_argument("--device", default=None,
                     help="train there (e.g. cuda): weights close to, not bit-equal to, a CPU build (default: CPU)")
    zoo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from analyses.zoo import ZOO, ZOO_DIR, build, status, zoo_entry
    from tasks import ConfigError

    zoo_dir = args.dir or ZOO_DIR
    if args.action == "list":
        if args.names:
            raise ConfigError("workbench zoo list takes no names; use workbench zoo build NAME ...")
        for entry in ZOO.values():
            print(f"{entry.name:24s} {entry.origin:12s} {status(entry.name, zoo_dir):8s} {entry.about}")
            sets = " ".join(f"--set '{o}'" for o in entry.overrides)
            same = (f"workbench curriculum {entry.curriculum} --out runs/zoo-stages/{entry.name} {sets}, the last stage"
                    if entry.curriculum else f"workbench train --preset {entry.preset} {sets}")
            print(f"{'':24s} rebuild: {entry.command()}  (= {same.rstrip()})")
        return 0
    names = args.names or list(ZOO)
    for name in names:
        zoo_entry(name)  # every name checked before anything trains
    for name in names:
        started = time.perf_counter()
        print(f"zoo: building {name} ({zoo_entry(name).about})")
        print(f"zoo: {build(name, zoo_dir, progress=not args.no_progress, device=args.device)} in "
              f"{time.perf_counter() - started:.0f} s")
    return 0
