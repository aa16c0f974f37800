"""Named run configurations, registered by the tasks: each task's module in interp/tasks/ (or a
`<task>_presets.py` beside it) calls `register_preset` for its presets, so this registry names no
task. `all_presets` and `get_preset` import interp.tasks (the list of the tasks' modules) before
they look, so a preset is found from a fresh Python with nothing imported first. The naming
convention: `*-cpu` presets learn on 2 CPU cores in minutes; `*-gpu` presets ask for CUDA and
bf16 and are sized by FLOP count to at most 10 minutes of one H100 each; `*-paper` presets follow
the papers' recipes (docs/papers.md) and want a GPU."""

from __future__ import annotations

from collections.abc import Callable

from models.config import RunConfig
from tasks import ConfigError

PRESETS: dict[str, Callable[[], RunConfig]] = {}  # name -> factory, in registration order
DEFAULT_PRESETS: dict[str, str] = {}  # task name -> the preset `workbench train --task NAME` uses
QUICK_START: list[str] = []  # the preset `workbench demo` and a bare `workbench train` use (one at most)


def register_preset(name: str, factory: Callable[[], RunConfig], default_for: str | None = None,
                    quick_start: bool = False) -> None:
    """Make `name` a preset. `default_for`: the task whose default preset it is. `quick_start`: the
    preset `workbench demo` trains, and `workbench train` with neither --task, --preset nor
    --config (one task's module says so)."""
    known = PRESETS.get(name)
    if known is not None and known is not factory:
        raise RuntimeError(f"two presets are named {name!r}: {known.__module__}.{known.__qualname__} and "
                           f"{factory.__module__}.{factory.__qualname__}")
    if default_for is not None and DEFAULT_PRESETS.get(default_for, name) != name:
        raise RuntimeError(f"task {default_for!r} has two default presets: {DEFAULT_PRESETS[default_for]!r} "
                           f"and {name!r}")
    if quick_start and QUICK_START and QUICK_START[0] != name:
        raise RuntimeError(f"two presets are the quick start: {QUICK_START[0]!r} and {name!r}")
    PRESETS[name] = factory
    if default_for is not None:
        DEFAULT_PRESETS[default_for] = name
    if quick_start and not QUICK_START:
        QUICK_START.append(name)


def load_task_plugins() -> None:
    """Import interp.tasks, the list of the tasks' own modules, which register their presets and
    curricula as they load. The one import from models/ up to interp/ (tests/unit/test_seams.py
    allows it and no other): it lets `get_preset` and `get_curriculum` work from a bare
    `import models.presets`, whatever was imported before."""
    import interp.tasks  # noqa: F401


def all_presets() -> dict[str, Callable[[], RunConfig]]:
    """Every preset's factory by name, in registration order."""
    load_task_plugins()
    return PRESETS


def get_preset(name: str) -> RunConfig:
    presets = all_presets()
    if name not in presets:
        raise ConfigError(f"preset {name!r} is unknown; use one of {sorted(presets)}")
    return presets[name]()


def default_preset(task: str) -> str:
    """The preset a task trains with when none is named (registered by the task's interp module)."""
    all_presets()
    if task not in DEFAULT_PRESETS:
        raise ConfigError(f"task {task!r} has no default preset; name one with --preset (see `workbench presets`)")
    return DEFAULT_PRESETS[task]


def quick_start_preset() -> str:
    """The preset `workbench demo` and a bare `workbench train` train (registered with
    `quick_start=True` by one task)."""
    all_presets()
    if not QUICK_START:
        raise ConfigError("no task registers a quick-start preset; name one with --preset (see `workbench presets`)")
    return QUICK_START[0]
