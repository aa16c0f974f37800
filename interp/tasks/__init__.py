"""Each task's analysis, one module per task (the task's name), and the list of them.

A task's module defines its `TaskAnalysis` subclass (interp/task_analysis.py): findings (probes,
verdict), headline, report sections, training curves. Its presets and curricula are registered
when its module (or a `<task>_presets.py` beside it) is imported
(`models.presets.register_preset`, `models.curriculum.register_curriculum`). Adding a task is
one line in each list below."""

from interp.task_analysis import TaskAnalysis, check_analysis
from interp.tasks import composite, composite_presets, lego, lego_presets, modsum, templates  # noqa: F401 (presets)
from tasks import ConfigError

ANALYSES: dict[str, TaskAnalysis] = {  # task name -> its analysis
    "composite": composite.CompositeAnalysis(),
    "lego": lego.LegoAnalysis(),
    "modsum": modsum.ModsumAnalysis(),
    "templates": templates.TemplatesAnalysis(),
}
for _name, _analysis in ANALYSES.items():  # the contract is checked when the list is read, not when it first fails
    check_analysis(_name, _analysis)


def analysed_tasks() -> list[str]:
    """The tasks with an analysis, sorted."""
    return sorted(ANALYSES)


def task_analysis(name: str) -> TaskAnalysis:
    """The analysis of task `name`; ConfigError (exit 2) naming the known ones where there is none."""
    if name not in ANALYSES:
        raise ConfigError(f"no analysis is registered for task {name!r}; known: {analysed_tasks()}. Add "
                          f"interp/tasks/{name}.py and list it in interp/tasks/__init__.py (CONTRIBUTING.md)")
    return ANALYSES[name]
