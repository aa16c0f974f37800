"""Tasks: what the model sees. Pure data, seeded by a local generator, no model code."""

from tasks.base import Batch, ConfigError, logits_at_labels, seeded_generator
from tasks.composite import CompositeConfig, CompositeTask
from tasks.lego import LegoConfig, LegoTask

TASK_CONFIGS = {"lego": LegoConfig, "composite": CompositeConfig}
Task = LegoTask | CompositeTask


def make_task(cfg: LegoConfig | CompositeConfig) -> Task:
    """The task object a config describes."""
    return {"lego": LegoTask, "composite": CompositeTask}[cfg.name](cfg)


__all__ = ["Batch", "CompositeConfig", "CompositeTask", "ConfigError", "LegoConfig", "LegoTask",
           "TASK_CONFIGS", "Task", "logits_at_labels", "make_task", "seeded_generator"]
