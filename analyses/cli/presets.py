"""`workbench presets`: the presets the tasks register, with their configurations."""

from __future__ import annotations

import argparse

from analyses.cli.common import load_tasks


def add_parser(sub: argparse._SubParsersAction) -> None:
    presets = sub.add_parser("presets", help="list the presets with their configurations")
    presets.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from models.presets import PRESETS

    load_tasks()  # a task's module in interp/tasks/ may register presets
    for name, make in PRESETS.items():
        print(f"== {name}: {(make.__doc__ or '').strip().splitlines()[0]}")
        print(make().to_json())
    return 0
