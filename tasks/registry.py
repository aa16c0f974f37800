"""The task registry: every task module of `tasks/` registers its config and task classes when it
is imported (`register_task` at its end), and `tasks/__init__.py` imports every module of the
package, so a new task is a new file and nothing else here. The config loader (the task section
of config.json), the trainer and the command line read the registry.

The first time a task is looked up (`registered_task`, so before a config of it is read or a task
built), it is held to the Task contract (`tasks.contract.check_task`: built from its config's
defaults, every member called once), and a task that breaks it is refused with a message naming
the task, the member and the doc section. The check is not run at import, so a broken task does
not stop the others from working.

A task's analysis (verdict, probes, report sections, default preset) lives in `interp/tasks/`,
listed in interp/tasks/__init__.py (`ANALYSES`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tasks.base import ConfigError, Task
from tasks.contract import check_task


@runtime_checkable
class TaskConfig(Protocol):
    """What every task's config is: a dataclass whose fields are the task section of config.json,
    with `name`, the name its task is registered under (the field's default)."""

    name: str


@dataclass(frozen=True)
class RegisteredTask:
    name: str
    config: type  # a dataclass implementing TaskConfig, built from the task section
    task: type  # a class implementing tasks.Task, built from the config: task(config)


_TASKS: dict[str, RegisteredTask] = {}
_CHECKED: dict[str, RegisteredTask] = {}  # the tasks that passed the contract check, as they were checked


def register_task(name: str, config_cls: type, task_cls: type) -> None:
    """Make `name` a task: `{"task": {"name": name, ...}}` builds `config_cls(...)`, and
    `make_task` turns that into `task_cls(config)`. The config's `name` field defaults to `name`."""
    known = _TASKS.get(name)
    if known is not None and (known.config, known.task) != (config_cls, task_cls):
        raise RuntimeError(f"two tasks are named {name!r}: {known.task.__module__}.{known.task.__name__} and "
                           f"{task_cls.__module__}.{task_cls.__name__}")
    default = {f.name: f.default for f in dataclasses.fields(config_cls)}.get("name") \
        if dataclasses.is_dataclass(config_cls) else None
    if default != name:
        raise RuntimeError(f"task {name!r}: {config_cls.__name__} must be a dataclass whose field `name` defaults "
                           f"to {name!r}")
    _TASKS[name] = RegisteredTask(name, config_cls, task_cls)


def task_names() -> list[str]:
    """The registered tasks, sorted."""
    return sorted(_TASKS)


def registered_task(name: object) -> RegisteredTask:
    """The task registered as `name` (any value read from a config: it is checked here);
    ConfigError naming the known ones where there is none, TaskContractError (a ConfigError)
    where the task breaks the Task contract (checked once, the first time)."""
    if not isinstance(name, str) or name not in _TASKS:
        raise ConfigError(f"task.name={name!r} is unknown; it must be a string, one of {task_names()}")
    entry = _TASKS[name]
    if _CHECKED.get(name) != entry:
        _CHECKED[name] = entry  # first, so that a task built inside its own check is not checked again
        try:
            check_task(name, entry.config, entry.task)
        except BaseException:
            del _CHECKED[name]
            raise
    return entry


def make_task(cfg: TaskConfig) -> Task:
    """The task object a config describes."""
    return registered_task(cfg.name).task(cfg)
