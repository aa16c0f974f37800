"""`workbench analyze-model`: interp/outside.py's analysis from the command line, for any
HookedTransformer that a function of the user's returns and prompt pairs in a JSON file.

    workbench analyze-model --model analyses/examples/induction.py:build \\
        --prompts analyses/examples/induction_pairs.json --out runs/induction

`--model` is `FILE.py:FUNCTION` or `package.module:FUNCTION`; FUNCTION() takes no arguments and
returns a `transformer_lens.HookedTransformer`. The file's folder (or, for a module, the current
folder) is on the import path while it loads and FUNCTION runs, as `python FILE.py` and
`python -m` would have it. Anything wrong with the spec, the file, the function or what it
returns is a ConfigError (exit 2) naming the spec; so is an exception the user's code raises
(its traceback with `--debug`): it is not the workbench's bug to report. The pairs file is
`PromptPairs.from_json`'s format (docs/outside-models.md), read strictly."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

from interp.outside import OutsideAnalysis, PromptPairs, analyze_model, non_finite_clause
from models.run_folder import RunFolder
from models.runs import ANALYSIS, ERROR_LOG, LOCK, REPORT, run_lock
from tasks import ConfigError

OUTPUTS = (ANALYSIS, REPORT)  # what analyze-model writes into --out
MAY_HOLD = {*OUTPUTS, LOCK, ERROR_LOG}  # what an --out it writes again may hold: its own earlier outputs


def check_out_folder(out: Path) -> None:
    """--out must be new, empty, or hold only an earlier analyze-model's files; never a run
    folder (its analysis.json and report.html are `workbench analyze`'s) or someone's other files.
    Checked before the model is built, so a refused command writes nothing."""
    folder = RunFolder(out, named_by="--out")
    if not folder.check_place("the analysis"):
        return
    if folder.holds_run():
        raise ConfigError(f"--out {out} holds a training run; `workbench analyze {out}` analyses that run. Choose a "
                          "new or empty folder for analyze-model")
    others = sorted(p.name for p in out.iterdir() if p.name not in MAY_HOLD)
    if others:
        raise ConfigError(f"--out {out} holds files that analyze-model does not write ({', '.join(others[:5])}); "
                          "choose a new or empty folder")


def load_factory(spec: str) -> Callable[[], Any]:
    """The function `spec` names: `path/to/file.py:FUNCTION` or `package.module:FUNCTION`."""
    source, _, name = spec.rpartition(":")
    if not source or not name.isidentifier():
        raise ConfigError(f"--model {spec!r} is not FILE.py:FUNCTION or package.module:FUNCTION (e.g. --model "
                          "analyses/examples/induction.py:build)")
    module = _import_file(spec, Path(source)) if _is_file(source) else _import_module(spec, source)
    factory = getattr(module, name, None)
    if factory is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"--model {spec}: {source} has no {name!r}; it defines {defined or 'no public function'}")
    if not callable(factory):
        raise ConfigError(f"--model {spec}: {name} is not a function (it is {type(factory).__name__})")
    return factory


def _is_file(source: str) -> bool:
    return source.endswith(".py") or "/" in source or "\\" in source


def _import_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"--model {spec}: {path} "
                          + ("is a folder, not a file" if path.is_dir() else "does not exist"))
    name = f"_workbench_model_{abs(hash(str(path.resolve())))}"  # registered, so that dataclasses in it work
    loader = importlib.util.spec_from_file_location(name, path)
    if loader is None or loader.loader is None:
        raise ConfigError(f"--model {spec}: {path} cannot be imported as Python (name it *.py)")
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module
    try:
        with _on_path(path.resolve().parent), _user_code(spec, f"importing {path}"):
            loader.loader.exec_module(module)
    except ConfigError:
        del sys.modules[name]
        raise
    return module


def _import_module(spec: str, source: str) -> Any:
    with _on_path(Path.cwd()):
        try:
            return importlib.import_module(source)
        except ModuleNotFoundError as err:
            if err.name and (source == err.name or source.startswith(f"{err.name}.")):
                raise ConfigError(f"--model {spec}: no module named {err.name!r} (install it, run from the folder "
                                  f"that holds it, or give its file: path/to/module.py:FUNCTION)") from None
            raise ConfigError(f"--model {spec}: importing {source} failed ({type(err).__name__}: {err})") from err
        except SystemExit as err:
            raise ConfigError(f"--model {spec}: importing {source} called sys.exit({err.code!r})") from err
        except Exception as err:  # noqa: BLE001 (the user's module, not the workbench: any failure is theirs)
            raise ConfigError(f"--model {spec}: importing {source} failed ({type(err).__name__}: {err})") from err


@contextlib.contextmanager
def _on_path(folder: Path) -> Iterator[None]:
    """`folder` first on the import path, as `python FILE.py` (its folder) or `python -m` (the
    current folder) puts it, so that the user's code imports its neighbours."""
    entry = str(folder)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


@contextlib.contextmanager
def _user_code(spec: str, doing: str) -> Iterator[None]:
    """An exception from the user's code as a ConfigError naming the spec; the original stays
    its cause (printed with --debug)."""
    try:
        yield
    except ConfigError:
        raise
    except SystemExit as err:  # sys.exit() in a factory would end the workbench with the user's status
        raise ConfigError(f"--model {spec}: {doing} called sys.exit({err.code!r}); a model factory must return "
                          "a HookedTransformer, not exit") from err
    except Exception as err:  # noqa: BLE001 (the user's code, not the workbench: any failure is theirs)
        raise ConfigError(f"--model {spec}: {doing} failed ({type(err).__name__}: {err}); --debug prints its "
                          "traceback") from err


def build_model(spec: str, device: torch.device, seed: int) -> HookedTransformer:
    """Call the factory `spec` names (torch's global generator seeded first, for a factory that
    initialises at random) and move what it returns to `device`."""
    factory = load_factory(spec)
    source = spec.rpartition(":")[0]
    torch.manual_seed(seed)
    folder = Path(source).resolve().parent if _is_file(source) else Path.cwd()
    with _on_path(folder), _user_code(spec, f"calling {factory.__name__}()"):
        model = factory()
    if not isinstance(model, HookedTransformer):
        raise ConfigError(f"--model {spec}: {factory.__name__}() returned {type(model).__module__}."
                          f"{type(model).__qualname__}, not a transformer_lens HookedTransformer")
    return model.to(device, print_details=False)  # TL's .to prints a line by default


def read_pairs(path: Path, model: HookedTransformer) -> PromptPairs:
    """The prompt pairs of --prompts, checked against the model's vocabulary and context."""
    try:
        return PromptPairs.from_json(path, model=model)
    except ValueError as err:  # every message of from_json starts with the file's path
        raise ConfigError(f"--prompts {err}") from None


def analyze_outside(model_spec: str, prompts: Path, out: Path, device: torch.device,
                    seed: int = 0) -> tuple[OutsideAnalysis, list[Path]]:
    """Build the model, read the pairs, analyse, and write OUT/analysis.json and OUT/report.html;
    every input is checked before the folder is made."""
    check_out_folder(out)
    model = build_model(model_spec, device, seed)
    pairs = read_pairs(prompts, model)
    analysis = analyze_model(model, pairs)
    with run_lock(out):  # one writer at a time; the lock file goes when the block ends
        check_out_folder(out)  # again under the lock: a run written meanwhile is not overwritten
        written = [analysis.write_json(out / ANALYSIS), analysis.write_report(out / REPORT, title=f"{model_spec} on "
                                                                                                  f"{prompts.name}")]
    return analysis, written


def summary_lines(analysis: OutsideAnalysis) -> list[str]:
    """What the command prints: the circuit, and each head's label."""
    circuit = analysis.patching.circuit
    edges = ", ".join(f"{s} -> {r}" for s, r, _ in circuit.edges) or (
        f"none ({analysis.patching.paths_refused})" if analysis.patching.paths_refused else "none")
    labels = " ".join(f"L{layer}H{head} {label}" for layer, row in enumerate(analysis.heads.labels)
                      for head, label in enumerate(row))
    lines = [f"circuit: {', '.join(circuit.nodes) or 'no heads'} (faithfulness {circuit.faithfulness}); edges: {edges}",
             f"head labels: {labels}"]
    bad = non_finite_clause(analysis.model)
    return [f"warning: the model's {bad}", *lines] if bad else lines
