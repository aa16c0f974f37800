"""`workbench presets`: one line per preset (name, task, sizes, what it is for); `--json` prints
each one's full configuration."""

from __future__ import annotations

import argparse

DESCRIPTION_CHARS = 60


def add_parser(sub: argparse._SubParsersAction) -> None:
    presets = sub.add_parser("presets", help="list the presets, one line each (--json: their full configurations)")
    presets.add_argument("--json", action="store_true", help="print every preset's full configuration as JSON")
    presets.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from models.presets import all_presets

    if not args.json:
        print(f"{'preset':18s} {'task':10s} {'layers, d_model, heads; steps x batch':34s} about")
    for name, make in all_presets().items():
        description = " ".join((make.__doc__ or "").split())
        if args.json:
            print(f"== {name}: {description}")
            print(make().to_json())
        else:
            print(preset_line(name, make(), description))
    return 0


def preset_line(name: str, cfg, description: str) -> str:
    """`name  task  sizes  description`: the model's shape and the training length, and the
    docstring's first sentence cut to DESCRIPTION_CHARS."""
    model, train = cfg.model, cfg.train
    sizes = f"{model.n_layers}L d{model.d_model} {model.n_heads}h, {train.steps:,} steps x {train.batch_size}"
    first = description.split(". ")[0].rstrip(".")
    if len(first) > DESCRIPTION_CHARS:
        first = first[:DESCRIPTION_CHARS].rsplit(" ", 1)[0] + " ..."
    return f"{name:18s} {cfg.task.name:10s} {sizes:34s} {first}"
