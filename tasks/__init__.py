"""Tasks: what the model sees. Pure data, seeded by a local generator, no model code."""

from tasks.base import Batch, ConfigError, CounterfactualPairs, Task, logits_at_labels, seeded_generator
from tasks.composite import CompositeConfig, CompositeTask
from tasks.lego import LegoConfig, LegoTask
from tasks.templates import TemplatesConfig, TemplatesTask

TASK_CONFIGS = {"lego": LegoConfig, "composite": CompositeConfig, "templates": TemplatesConfig}


def make_task(cfg: LegoConfig | CompositeConfig | TemplatesConfig) -> Task:
    """The task object a config describes."""
    return {"lego": LegoTask, "composite": CompositeTask, "templates": TemplatesTask}[cfg.name](cfg)


__all__ = ["Batch", "CompositeConfig", "CounterfactualPairs", "CompositeTask", "ConfigError", "LegoConfig", "LegoTask",
           "TASK_CONFIGS", "Task", "TemplatesConfig", "TemplatesTask", "logits_at_labels", "make_task",
           "seeded_generator"]
