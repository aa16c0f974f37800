"""Each task's analysis, one module per task (the task's name): its findings (probes, verdict),
headline, report sections, training curves, presets and curricula (in the task's module, or a
`<task>_presets.py` beside it), registered when the module is imported
(`interp.analysis.register_analysis`, `models.presets.register_preset`,
`models.curriculum.register_curriculum`). Importing this
package imports every module in it, so a new task's analysis is one new file, found by name."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):  # each registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")
