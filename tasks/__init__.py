"""Tasks: what the model sees. Pure data, seeded by a local generator, no model code.

Each task module registers its config and task classes (`tasks.registry.register_task`) when it
is imported; the imports below are the list of tasks (adding one: a new file and one name here)."""

from tasks import modsum  # noqa: F401 (registers the toy task; it exports nothing)
from tasks.base import Batch, ConfigError, CounterfactualPairs, Task, logits_at_labels, seeded_generator
from tasks.composite import CompositeConfig, CompositeTask
from tasks.contract import TaskContractError
from tasks.lego import LegoConfig, LegoTask
from tasks.registry import TaskConfig, make_task, register_task, registered_task, task_names
from tasks.templates import TemplatesConfig, TemplatesTask

__all__ = ["Batch", "CompositeConfig", "CounterfactualPairs", "CompositeTask", "ConfigError", "LegoConfig", "LegoTask",
           "Task", "TaskConfig", "TaskContractError", "TemplatesConfig", "TemplatesTask", "logits_at_labels",
           "make_task", "register_task", "registered_task", "seeded_generator", "task_names"]
