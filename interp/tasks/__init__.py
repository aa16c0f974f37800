"""Each task's analysis, one module per task (the task's name): its findings (probes, verdict),
headline, report sections, training curves and default preset, registered when the module is
imported (`interp.analysis.register_analysis`, `models.presets.register_preset`). Importing this
package imports every module in it, so a new task's analysis is one new file, found by name. A
large analysis keeps its parts beside it, named `<task>_<part>.py` (`lego_verdict.py`,
`lego_probes.py`, ...); only the task's own module registers."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):  # each registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")
