"""What several commands share: the exit statuses, the options of a training run, the tasks'
registries loaded, a config resolved from a preset or --config and --set, and one training run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_UNEXPECTED, EXIT_CONFIG, EXIT_DIVERGED, EXIT_WRITE = 1, 2, 3, 4


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set model.tie_layers=true (repeatable)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default: the config's (auto = CUDA when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_ensemble_argument(p: argparse.ArgumentParser) -> None:
    """`--ensemble auto|on|off` on a command that trains cells (sweep, study); the modes are
    analyses/runners/ensemble.py's ENSEMBLE_MODES, written out so that building the parser imports no torch."""
    p.add_argument("--ensemble", choices=("auto", "on", "off"), default="auto",
                   help="train same-shape cells as one stacked ensemble: on, off, or auto (default: on for "
                        "CUDA, off on the CPU; docs/ensembles.md)")


def load_tasks() -> list[str]:
    """The registered tasks (tasks/__init__.py lists them), with their presets registered too."""
    from models.presets import load_task_plugins
    from tasks import task_names

    load_task_plugins()
    return task_names()


def resolve_config(args: argparse.Namespace, preset: str | None, task: str | None):
    from models.presets import default_preset, get_preset, quick_start_preset
    from tasks import ConfigError

    known = load_tasks()
    if preset is not None and not preset.strip():  # '' is not "no --preset": it would train the default one
        raise ConfigError(f"--preset {preset!r} names no preset; give one (`workbench presets` lists them) or leave "
                          f"--preset out")
    if task is not None and task not in known:
        raise ConfigError(f"--task {task!r} is unknown; use one of {known}")
    config_file = getattr(args, "config", None)
    if config_file is not None:
        if preset:
            raise ConfigError("--config and --preset both give the configuration; use one")
        cfg = config_from_file(config_file)
    else:
        name = preset or (default_preset(task) if task else quick_start_preset())
        cfg = get_preset(name)
    if task and cfg.task.name != task:
        source = f"--config {config_file}" if config_file is not None else f"--preset {name}"
        raise ConfigError(f"{source} is a {cfg.task.name} configuration but --task is {task}")
    overrides = list(args.overrides) + ([f"train.device={json.dumps(args.device)}"] if args.device else [])
    return cfg.with_overrides(overrides)


def config_from_file(path: Path):
    """A RunConfig from a JSON file, read strictly (models.runs.read_json); a run's config.json
    works as it is (its package versions are ignored)."""
    from models.runs import read_config_file
    from tasks import ConfigError

    try:
        return read_config_file(path)
    except ConfigError as err:
        raise ConfigError(f"--config: {err}") from None


def train_run(cfg, out: Path, resume: bool, progress: bool) -> int:
    from models.run_folder import RunFolder
    from models.runs import model_sizes, out_of_memory
    from models.train import TrainingDiverged, train
    from tasks import ConfigError

    try:
        result = train(cfg, out, resume=resume, progress=progress)
    except TrainingDiverged as err:
        print(f"workbench: training diverged: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except RuntimeError as err:  # torch.OutOfMemoryError is one too
        if not out_of_memory(err):
            raise
        if not resume:
            RunFolder(out).remove_unstarted_run()  # so that the same --out can be used again with other settings
        sizes = cfg.train
        raise ConfigError(f"out of memory ({str(err).splitlines()[0][:200]}). The run's sizes: train.batch_size="
                          f"{sizes.batch_size}, train.eval_size={sizes.eval_size}, train.n_train={sizes.n_train}, "
                          f"{model_sizes(cfg)}; lower the one that is too large") from None
    summary = {k: v for k, v in result.final.items() if not isinstance(v, dict)}  # tables (per pair) are left out
    print(f"trained {result.steps} steps in {result.seconds:.1f} s -> {out}\n{json.dumps(summary)}")
    return 0
