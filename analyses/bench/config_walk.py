"""The config's walk: which modules a training run's config is handed through, in order, from
`analyses/cli/common.py:train_run` to the first training step, and how often the walk comes back
to a module it had already left.

    OMP_NUM_THREADS=1 .venv/bin/python -m analyses.bench.config_walk [--hops N]

What is traced: `train_run` of a tiny lego-cpu run (2 layers, d 32, 2 steps) in a temporary
folder, under `sys.setprofile`, until the first call of `Stack.step` (models/step.py), the first
training step: so `models.train.train`: `Trainer(...)` construction, then `fit()` up to that step (the folder's lock,
`_start`, `begin_loop`, the stack, the first batch). The modules train_run imports are imported
beforehand, so imports are not part of the walk. Only Python functions of the project's packages
(tasks, models, interp, analyses: files of this checkout, not .venv) count.

The walk's steps: the calls made from another module (a call within a module is that module's
own business) at most N module hops below train_run (default 2): the hops of a call are the
module changes along the chain of project frames from train_run down to it. With N = 2 the walk
is what train_run and the trainer (models/train.py) ask of other modules; N = 3 adds what those
modules ask in turn (the file primitives of models/safe_files.py among them).

A stay is a maximal run of consecutive steps in one module; a return is a stay in a module the
walk had already left. Output: the stays in order (`<-` marks a return), then the counts of
stays, distinct modules and returns (returns = stays - modules), and the stays per module.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tasks", "models", "interp", "analyses")
HERE = str(Path(__file__).resolve())
TINY = ["model.n_layers=2", "model.d_model=32", "model.d_mlp=64", "model.planted={}", "train.steps=2",
        "train.batch_size=16", "train.eval_every=2", "train.eval_size=64", "train.warmup_steps=1"]
FIRST_STEP = ("models/step.py", "step")  # Stack.step, the only `step` there
_modules: dict[str, str | None] = {}


def module_of(filename: str) -> str | None:
    """The project module of a code object's file, as a path below the checkout; None for others."""
    if filename not in _modules:
        path = Path(filename).resolve()
        inside = path.is_relative_to(ROOT) and str(path) != HERE and path.relative_to(ROOT).parts[0] in PACKAGES
        _modules[filename] = str(path.relative_to(ROOT)) if inside else None
    return _modules[filename]


def trace_walk(max_hops: int) -> list[tuple[str, str]]:
    """(module, function) of every step of the walk, in call order."""
    from analyses.cli.common import load_tasks, train_run
    from models.presets import get_preset
    from models.run_folder import RunFolder  # noqa: F401 (imported before the trace, as train_run's imports are)
    from models.runs import model_sizes  # noqa: F401
    from models.train import Trainer  # noqa: F401

    load_tasks()
    cfg = get_preset("lego-cpu").with_overrides(TINY)
    steps: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call" or (module := module_of(frame.f_code.co_filename)) is None:
            return
        if (module, frame.f_code.co_name) == FIRST_STEP:
            sys.setprofile(None)  # training goes on untraced
            return
        chain, caller = [module], frame.f_back
        while caller is not None:
            if (above := module_of(caller.f_code.co_filename)) is not None:
                chain.append(above)
            caller = caller.f_back
        hops = sum(a != b for a, b in zip(chain, chain[1:]))
        if (len(chain) == 1 or chain[1] != module) and hops <= max_hops:
            steps.append((module, getattr(frame.f_code, "co_qualname", frame.f_code.co_name)))

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        sys.setprofile(profile)
        try:
            status = train_run(cfg, Path(tmp) / "run", resume=False, progress=False)
        finally:
            sys.setprofile(None)
    assert status == 0, f"train_run returned {status}"
    return steps


def stays_of(steps: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The walk's stays: (module, the functions entered there), consecutive steps in one module merged."""
    stays: list[tuple[str, list[str]]] = []
    for module, name in steps:
        if stays and stays[-1][0] == module:
            stays[-1][1].append(name)
        else:
            stays.append((module, [name]))
    return stays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hops", type=int, default=2, help="steps at most this many module hops below train_run")
    args = parser.parse_args()
    stays = stays_of(trace_walk(args.hops))
    seen, returns = set(), 0
    print(f"the config's walk, train_run to the first training step, calls across modules within {args.hops} hops:")
    for index, (module, names) in enumerate(stays, 1):
        back = module in seen
        returns += back
        seen.add(module)
        print(f"{index:3d} {'<-' if back else '  '} {module:28s} {', '.join(dict.fromkeys(names))}")
    per_module = Counter(module for module, _ in stays)
    print(f"stays {len(stays)}, modules {len(per_module)}, returns {returns} (target: at most 3)")
    print("stays per module: " + ", ".join(f"{module} {n}" for module, n in per_module.most_common()))


if __name__ == "__main__":
    main()
