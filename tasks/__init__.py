"""Tasks: what the model sees. Pure data, seeded by a local generator, no model code.

Every module of this package is imported here, and each task module registers its config and
task classes (`tasks.registry.register_task`): a new task is one new file, found by name."""

import importlib
import pkgutil

from tasks.base import Batch, ConfigError, CounterfactualPairs, Task, logits_at_labels, seeded_generator
from tasks.composite import CompositeConfig, CompositeTask
from tasks.contract import TaskContractError
from tasks.lego import LegoConfig, LegoTask
from tasks.registry import TaskConfig, make_task, register_task, registered_task, task_names
from tasks.templates import TemplatesConfig, TemplatesTask

for _module in pkgutil.iter_modules(__path__):  # the task modules register themselves on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Batch", "CompositeConfig", "CounterfactualPairs", "CompositeTask", "ConfigError", "LegoConfig", "LegoTask",
           "Task", "TaskConfig", "TaskContractError", "TemplatesConfig", "TemplatesTask", "logits_at_labels",
           "make_task", "register_task", "registered_task", "seeded_generator", "task_names"]
