"""The `workbench` command line. Exit status: 0 done, 1 an unexpected error (the message names
the command and where its traceback was saved; `--debug` prints it), 2 bad configuration,
arguments or run folder (nothing written), 3 training diverged (recorded in the run's
metrics.jsonl), 4 could not write (disk full, permission denied: the message names the file)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from analyses.circuit_cmd import add_circuit_commands
from analyses.ensemble_runner import add_ensemble_argument
from tasks import ConfigError

EXIT_UNEXPECTED, EXIT_CONFIG, EXIT_DIVERGED, EXIT_WRITE = 1, 2, 3, 4
DEFAULT_TASK = "lego"  # what `workbench train` trains with neither --task, --preset nor --config
_DESCRIPTION = ("Train small transformers on synthetic reasoning tasks and look inside them. "
                "Exit status: 0 done, 1 unexpected error (traceback saved; --debug prints it), 2 bad configuration "
                "(nothing written), 3 training diverged, 4 could not write (disk full, permission denied).")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_CONFIG
    try:
        _check_name_lengths(args)
        _check_out_link(args)
        return args.run(args)
    except ConfigError as err:
        if args.debug and err.__cause__ is not None:  # an error of the user's own code (analyze-model --model)
            traceback.print_exception(type(err.__cause__), err.__cause__, err.__cause__.__traceback__)
        print(f"workbench: configuration error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 (the top level: every failure gets a documented status and a message)
        if args.debug:
            traceback.print_exc()
        if isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:
            print(f"workbench {args.command}: configuration error: a name in {err.filename} is longer than the file "
                  f"system allows ({NAME_MAX} bytes a name); choose shorter names", file=sys.stderr)
            return EXIT_CONFIG
        if isinstance(err, OSError) and err.errno in (errno.EISDIR, errno.ENOTDIR):
            print(f"workbench {args.command}: configuration error: {err.filename2 or err.filename} is a folder where a file belongs "
                  f"(or the other way round); move it away", file=sys.stderr)
            return EXIT_CONFIG
        if _is_write_failure(err):
            where = getattr(err, "filename", None) or "a file of the run"
            print(f"workbench {args.command}: could not write {where}: {getattr(err, 'strerror', None) or err}. "
                  f"Free some space or fix the permissions, then run the command again (a training run continues "
                  f"from its last checkpoint with --resume)", file=sys.stderr)
            return EXIT_WRITE
        log = "" if args.debug else f" Its traceback is in {_save_traceback(args)}; please report it."
        print(f"workbench {args.command}: unexpected error ({type(err).__name__}: {err}).{log}", file=sys.stderr)
        return EXIT_UNEXPECTED


def _is_write_failure(err: BaseException) -> bool:
    """Disk full, over quota, permission denied or a read-only file system; safetensors reports
    those as its own SafetensorError, with the OS message inside."""
    from models.safe_files import WRITE_ERRNOS

    if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
        return True
    text = str(err)
    return type(err).__name__ == "SafetensorError" and any(os.strerror(code) in text for code in WRITE_ERRNOS)


def _save_traceback(args: argparse.Namespace) -> str:
    """Where the traceback of the error being handled was saved: in the --out folder of a command
    that writes one, where it exists (workbench-error.log), else in the temporary folder
    (workbench-error-*.log). Never in a folder the command was given to read (`analyze RUN_DIR`,
    `report RUN_DIR`). Never raises: the handler of an error must not fail in turn."""
    text = f"workbench {' '.join(sys.argv[1:])}\n{traceback.format_exc()}"
    out = getattr(args, "out", None)
    with contextlib.suppress(OSError, ValueError):
        if isinstance(out, Path) and out.is_dir() and not out.is_symlink():
            from models.runs import ERROR_LOG, atomic_write_bytes

            atomic_write_bytes(out / ERROR_LOG, text.encode())
            return str(out / ERROR_LOG)
    try:
        fd, name = tempfile.mkstemp(prefix="workbench-error-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return name
    except OSError as err:
        return f"nowhere (it could not be saved: {err.strerror}; run again with --debug to see it)"


NAME_MAX, PATH_MAX = 255, 4095  # bytes in one name, in a whole path (Linux, most file systems)


def _check_name_lengths(args: argparse.Namespace) -> None:
    """A path argument with a name longer than the file system takes is refused up front, naming
    the option: the file system's own error comes from wherever the name is first used."""
    for dest, value in vars(args).items():
        if not isinstance(value, Path):
            continue
        option = dest.upper() if dest == "run_dir" else f"--{dest.replace('_', '-')}"
        long = next((part for part in value.parts if len(os.fsencode(part)) > NAME_MAX), None)
        if long is not None:
            raise ConfigError(f"{option}: the name {long[:24]}... is {len(os.fsencode(long))} bytes, longer than the "
                              f"file system allows ({NAME_MAX} bytes a name); choose a shorter one")
        if len(os.fsencode(str(value.absolute()))) > PATH_MAX:
            raise ConfigError(f"{option} {str(value)[:40]}... is longer than the file system allows ({PATH_MAX} bytes "
                              f"a path); choose a shorter one")


def _check_out_link(args: argparse.Namespace) -> None:
    """An --out that is a symbolic link to nothing would create the link's far-away target."""
    out = getattr(args, "out", None)
    if isinstance(out, Path) and out.is_symlink() and not out.exists():
        raise ConfigError(f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist; the workbench "
                          f"does not create a link's target. Name a real folder")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=_DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="train one model into a run folder", description=_TRAIN_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--task", help="task, one of the registered ones (tasks/*.py; default: the preset's)")
    train.add_argument("--preset", help="named configuration (default: the task's own, e.g. lego-cpu); "
                                        "see `workbench presets`")
    train.add_argument("--config", type=Path, metavar="FILE",
                       help="a run configuration as JSON (task, model and train sections, e.g. another run's "
                            "config.json) instead of a preset; --set applies on top")
    train.add_argument("--out", required=True, type=Path, help="run folder to write")
    _add_run_options(train)
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--report", action="store_true", help="also write report.html when training ends")
    train.set_defaults(run=_cmd_train)

    demo = sub.add_parser("demo", help="train the lego-cpu model and write its report (the quick start)")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default: runs/demo)")
    demo.add_argument("--no-learned", action="store_true",
                      help="do not analyze the zoo's learned three-hop model into OUT-learned beside the demo")
    _add_run_options(demo)
    demo.set_defaults(run=_cmd_demo)

    curriculum = sub.add_parser("curriculum", help="train a recipe in stages, each starting from the last one's weights",
                                description="Train every stage of a curriculum into OUT/<stage> (resumably: a "
                                            "finished stage is kept, a partial one continues). Nothing is planted "
                                            "or mimicked; each stage starts from the weights of the one before it. "
                                            "Example: workbench curriculum lego-three-hops-albert --out runs/albert "
                                            "--set train.seed=1")
    curriculum.add_argument("name", nargs="?", help="the curriculum, e.g. lego-three-hops")
    curriculum.add_argument("--list", action="store_true", help="list the curricula with their stages and exit")
    curriculum.add_argument("--out", type=Path, help="folder of the stages' run folders")
    curriculum.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                            help="override a value in every stage, e.g. --set train.seed=1 (repeatable)")
    curriculum.add_argument("--no-progress", action="store_true", help="no progress bars")
    curriculum.set_defaults(run=_cmd_curriculum)

    analyze = sub.add_parser("analyze", help="look inside a trained run: heads, patching, probes, verdict")
    analyze.add_argument("run_dir", type=Path)
    analyze.add_argument("--samples", type=int, default=512, help="test sentences for head scores (default 512)")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                         help="where the model and its batches run (default: cpu, whatever device trained the run, so "
                              "the numbers are the same on every machine; cuda agrees within fp32 rounding; "
                              "auto = CUDA when present)")
    analyze.add_argument("--timeline", action="store_true",
                         help="instead: the verdict, head labels, exact head patching, the circuit (nodes) and the "
                              "probes at every snapshot of the run's weights, as timeline.json and a report section")
    analyze.add_argument("--bootstrap", type=int, default=0, metavar="N",
                         help="also find the circuit again on N resamples of the pairs: intervals and the stable core "
                              "(default 0: none; each resample costs what the circuit costs)")
    analyze.add_argument("--no-progress", action="store_true", help="no progress bar (with --timeline)")
    analyze.set_defaults(run=_cmd_analyze)

    outside = sub.add_parser("analyze-model", help="the same analysis on your own HookedTransformer and prompt pairs",
                             description=_ANALYZE_MODEL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    outside.add_argument("--model", required=True, metavar="FILE.py:FUNCTION",
                         help="FILE.py:FUNCTION or package.module:FUNCTION; FUNCTION() returns a HookedTransformer")
    outside.add_argument("--prompts", required=True, type=Path, metavar="PAIRS.json",
                         help="the prompt pairs (format: docs/outside-models.md)")
    outside.add_argument("--out", required=True, type=Path, help="folder for analysis.json and report.html")
    outside.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                         help="where the model runs (default: cpu; auto = CUDA when present)")
    outside.add_argument("--seed", type=int, default=0, help="seeds torch before FUNCTION() runs (default 0)")
    outside.set_defaults(run=_cmd_analyze_model)

    report = sub.add_parser("report", help="(re)write report.html of a trained run, or the page of a sweep",
                            description="A run folder: (re)write its report.html. A sweep folder (sweep.json, or "
                                        "sweep_plan.json while it runs): write its page, report.html and "
                                        "sweep_page.json, the grid coloured by verdict with links to every run.")
    report.add_argument("run_dir", type=Path, help="a run folder or a sweep folder")
    report.set_defaults(run=_cmd_report)

    study = sub.add_parser("study", help="run one experiment of the papers (many runs, one summary report)",
                           description="Run a study: train its cells (resumably), analyse them, write report.html "
                                       "and results.json into --out. `workbench study --list` names them all.")
    study.add_argument("name", nargs="?", help="e.g. lego-extrapolation, composite-phase, templates-efficiency")
    study.add_argument("--list", action="store_true", help="list the studies and exit")
    study.add_argument("--scale", default="cpu", help="tiny (seconds, smoke test), cpu (default, < 30 min on 2 cores), "
                                                      "gpu (one GPU, <= 10 min per model) or paper (the papers' sizes)")
    study.add_argument("--out", type=Path, help="study folder (default runs/studies/<name>-<scale>)")
    study.add_argument("--workers", type=int, default=1, help="cells trained at once (default 1)")
    study.add_argument("--backend", choices=["local", "ray"], default="local", help="where cells run (default local)")
    study.add_argument("--address", help="with --backend ray: the cluster address (default: a local Ray instance)")
    study.add_argument("--seeds", type=_seed_list, help="comma-separated training seeds replacing the study's own "
                                                         "(e.g. 0,1; default: one at cpu scale, more at paper scale)")
    study.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="composite studies: override every cell's base config, e.g. --set model.norm_position=post "
                            "(repeatable; needs --out)")
    study.add_argument("--gammas", type=_gamma_pair, metavar="SMALL,LARGE",
                       help="composite-mechanism: the two init rates to contrast (default: the scale's; the paper's "
                            "pair is 0.5,0.8)")
    study.add_argument("--protocol", help="composite studies: fast (default: lr 1e-3, biases, GELU, <= 3,000 steps) or "
                                          "matched (the composite-matched preset, the cpu protocol nearest the paper's: "
                                          "lr 1e-4, bias-free ReLU, up to 30,000 steps; hours per study, see "
                                          "docs/sweeps.md); default folder runs/studies/<name>-<scale>-matched")
    study.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_ensemble_argument(study)
    study.set_defaults(run=_cmd_study)

    sweep = sub.add_parser("sweep", help="train a grid of configs (many run folders, sweep.json, one report)",
                           description=_SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("--preset", required=True, help="the base configuration; see `workbench presets`")
    sweep.add_argument("--grid", nargs="+", required=True, metavar="SECTION.KEY=V1,V2",
                       help="the values each key takes; the sweep trains every combination")
    sweep.add_argument("--out", required=True, type=Path, help="sweep folder (one run folder per cell inside)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a base config value for every cell (repeatable)")
    sweep.add_argument("--workers", type=int, help="cells trained at once (default: one per core)")
    sweep.add_argument("--backend", choices=["local", "ray"], default="local", help="where cells run (default local)")
    sweep.add_argument("--address", help="with --backend ray: the cluster address (default: a local Ray instance)")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_ensemble_argument(sweep)
    sweep.set_defaults(run=_cmd_sweep)

    presets = sub.add_parser("presets", help="list the presets with their configurations")
    presets.set_defaults(run=_cmd_presets)

    zoo = sub.add_parser("zoo", help="list the committed zoo of trained runs, or rebuild entries of it")
    zoo.add_argument("action", nargs="?", choices=["list", "build"], default="list")
    zoo.add_argument("names", nargs="*", help="entries to build (default with build: every entry)")
    zoo.add_argument("--dir", type=Path, default=None, help="zoo folder (default: the repository's zoo/)")
    zoo.add_argument("--no-progress", action="store_true")
    zoo.add_argument("--device", default=None,
                     help="train there (e.g. cuda): weights close to, not bit-equal to, a CPU build (default: CPU)")
    zoo.set_defaults(run=_cmd_zoo)

    bench = sub.add_parser("benchmark", help="task generation rate, training throughput and FLOP/s vs a matmul peak")
    bench.add_argument("--quick", action="store_true", help="shorter measurements (for tests)")
    bench.add_argument("--patching", type=Path, metavar="RUN_DIR",
                       help="instead: exact vs TransformerLens vs attribution patching on this trained run")
    bench.add_argument("--label-index", type=int, default=0, help="with --patching: the label slot the metric reads")
    bench.add_argument("--device", choices=["cpu", "cuda"],
                       help="instead: the lego-gpu shape on this device (steps/s, fraction of a bf16 matmul peak, data "
                            "vs step time, patching vs TransformerLens)")
    bench.add_argument("--snapshots", action="store_true",
                       help="instead: training time and disk with the default snapshots against none (lego-cpu, "
                            "composite-matched), side by side")
    bench.add_argument("--ensemble", type=int, metavar="K",
                       help="instead: K members one after another against one ensemble of K, per shape (with "
                            "--device cuda the GPU shapes too)")
    bench.set_defaults(run=_cmd_benchmark)
    add_circuit_commands(sub)  # circuit-export, circuit-compare (analyses/circuit_cmd.py)
    return parser


_TRAIN_HELP = """Train one model into a run folder (config.json, model.safetensors, train_state.safetensors,
metrics.jsonl). Examples:
  workbench train --task lego --preset lego-cpu --out runs/lego1
  workbench train --preset composite-cpu --out runs/c1 --set model.init_gamma=0.3 --set train.seed=1
  workbench train --out runs/lego1 --resume        # continue a killed run"""


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set model.tie_layers=true (repeatable)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default: the config's (auto = CUDA when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load_tasks() -> list[str]:
    """The registered tasks (every module of tasks/), once their analyses and default presets
    (every module of interp/tasks/) are registered too."""
    import interp.tasks  # noqa: F401 (its modules register each task's analysis and default preset)
    from tasks import task_names

    return task_names()


def _resolve_config(args: argparse.Namespace, preset: str | None, task: str | None):
    from models.presets import default_preset, get_preset

    known = _load_tasks()
    if task is not None and task not in known:
        raise ConfigError(f"--task {task!r} is unknown; use one of {known}")
    config_file = getattr(args, "config", None)
    if config_file is not None:
        if preset:
            raise ConfigError("--config and --preset both give the configuration; use one")
        cfg = _config_from_file(config_file)
    else:
        name = preset or default_preset(task or DEFAULT_TASK)
        cfg = get_preset(name)
    if task and cfg.task.name != task:
        source = f"--config {config_file}" if config_file is not None else f"--preset {name}"
        raise ConfigError(f"{source} is a {cfg.task.name} configuration but --task is {task}")
    overrides = list(args.overrides) + ([f"train.device={json.dumps(args.device)}"] if args.device else [])
    return cfg.with_overrides(overrides)


def _config_from_file(path: Path):
    """A RunConfig from a JSON file, read strictly (models.runs.read_json); a run's config.json
    works as it is (its package versions are ignored)."""
    from models.runs import read_config_file

    try:
        return read_config_file(path)
    except ConfigError as err:
        raise ConfigError(f"--config: {err}") from None


def _train(cfg, out: Path, resume: bool, progress: bool) -> int:
    from models.runs import RunFolder, model_sizes, out_of_memory
    from models.train import Trainer, TrainingDiverged

    try:
        result = Trainer(cfg, out, resume=resume, progress=progress).fit()
    except TrainingDiverged as err:
        print(f"workbench: training diverged: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except RuntimeError as err:  # torch.OutOfMemoryError is one too
        if not out_of_memory(err):
            raise
        if not resume:
            RunFolder(out).remove_unstarted_run()  # so that the same --out can be used again with other settings
        train = cfg.train
        raise ConfigError(f"out of memory ({str(err).splitlines()[0][:200]}). The run's sizes: train.batch_size="
                          f"{train.batch_size}, train.eval_size={train.eval_size}, train.n_train={train.n_train}, "
                          f"{model_sizes(cfg)}; lower the one that is too large") from None
    summary = {k: v for k, v in result.final.items() if k not in ("acc_per_pair",)}
    print(f"trained {result.steps} steps in {result.seconds:.1f} s -> {out}\n{json.dumps(summary)}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from models.runs import CONFIG, RunFolder, read_config

    folder = RunFolder(args.out, named_by="--out")
    if args.resume:  # a config without a train state (a crash before the first checkpoint) restarts at step 0
        if not folder.holds_run():
            raise ConfigError(f"--resume: {args.out} has no {CONFIG}; there is nothing to resume")
        if args.preset or args.task or args.overrides or args.config:
            raise ConfigError("--resume continues the stored config.json; drop --preset/--task/--config/--set")
        cfg = read_config(args.out)
    else:
        cfg = _resolve_config(args, args.preset, args.task)
        folder.check_usable()
        folder.check_receives()  # before training; the trainer asks again under the folder's lock
    status = _train(cfg, args.out, args.resume, progress=not args.no_progress)
    if status == 0 and args.report:
        _cmd_report(argparse.Namespace(run_dir=args.out))
    return status


def _cmd_curriculum(args: argparse.Namespace) -> int:
    from models.curriculum import CURRICULA, get_curriculum, train_curriculum

    if args.list:
        for c in CURRICULA.values():
            print(f"{c.name}: {c.about}\n  preset {c.preset}, every stage: {' '.join(c.common)}")
            for stage in c.stages:
                print(f"  {stage.name}: {' '.join(stage.overrides)}")
        return 0
    if not args.name or args.out is None:
        raise ConfigError("name a curriculum and its folder: workbench curriculum NAME --out DIR "
                          "(workbench curriculum --list names them)")
    curriculum = get_curriculum(args.name)
    curriculum.configs(curriculum.folders(args.out), args.overrides)  # a bad --set is refused before anything trains
    started = time.perf_counter()
    results = train_curriculum(curriculum, args.out, args.overrides, progress=not args.no_progress)
    for r in results:
        acc = " ".join(f"{a:.3f}" for a in r.final.get("acc_per_var", []))
        print(f"{r.name:18s} {r.state:8s} {r.seconds:7.0f} s  step {r.final.get('step')}  acc per variable: {acc}")
    print(f"curriculum {curriculum.name}: {sum(r.seconds for r in results):.0f} s of training over "
          f"{len(results)} stages ({time.perf_counter() - started:.0f} s in this call) -> {args.out}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from analyses.demo import check_demo_folder, demo_learned
    from models.runs import DEMO, LOCK, RUN_FILES, atomic_write_bytes, run_lock
    from models.snapshots import SNAPSHOTS, remove_snapshots

    cfg = _resolve_config(args, "lego-cpu", "lego")
    started = time.perf_counter()
    check_demo_folder(args.out)
    with run_lock(args.out):  # nobody else writes the folder while the demo empties and retrains it
        check_demo_folder(args.out)  # again under the lock: a run written meanwhile is not deleted
        for path in args.out.iterdir():  # the demo starts fresh, but deletes only a run folder's own files
            if path.name == SNAPSHOTS:
                remove_snapshots(args.out)
            elif path.name in RUN_FILES and path.name != LOCK:
                path.unlink()
        atomic_write_bytes(args.out / DEMO, json.dumps({"config": cfg.to_dict()}, indent=1).encode())
        status = _train(cfg, args.out, resume=False, progress=not args.no_progress)
    if status == 0:
        _cmd_report(argparse.Namespace(run_dir=args.out))
        learned = None if args.no_learned else demo_learned(args.out, analyze=_cmd_analyze)
        print(f"demo finished in {time.perf_counter() - started:.0f} s; open {args.out / 'report.html'} in a browser"
              + (f" (and {learned / 'report.html'}, a circuit that was learned, not planted)" if learned else ""))
    return status


def _cmd_report(args: argparse.Namespace) -> int:
    from interp.run_report import write_run_report
    from interp.sweep_cells import is_sweep_folder
    from models.runs import CONFIG, load_run, run_lock

    if not args.run_dir.is_dir():
        raise ConfigError(f"{args.run_dir} is not a run folder; train one first (workbench train --out {args.run_dir})")
    if is_sweep_folder(args.run_dir) and not (args.run_dir / CONFIG).exists():
        return _report_sweep(args.run_dir)
    if not (args.run_dir / CONFIG).exists() and not (args.run_dir / CONFIG).is_symlink():
        raise ConfigError(f"{args.run_dir} is neither a run folder (it has no config.json) nor a sweep folder (no "
                          f"sweep.json or sweep_plan.json); give a folder written by `workbench train` or `workbench sweep`")
    with run_lock(args.run_dir):  # a folder in training is refused, naming the trainer
        path = write_run_report(load_run(args.run_dir))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def _report_sweep(folder: Path) -> int:
    """The sweep's page, written again (its own report.html and sweep_page.json only: no run is
    locked or written, so a sweep in progress can be looked at); exit 2 naming a damaged cell."""
    from interp.sweep_page import write_sweep_page

    page, html_path, json_path = write_sweep_page(folder)
    counts = ", ".join(f"{n} {status}" for status, n in page["counts"].items())
    print(f"wrote {html_path} and {json_path} ({len(page['cells'])} cells: {counts})")
    if page["damaged"]:
        first = page["damaged"][0]
        more = f" (and {len(page['damaged']) - 1} more damaged cell(s), listed on the page)" if len(page["damaged"]) > 1 else ""
        print(f"workbench report: configuration error: cell {first['cell']} is damaged: {first['error']}{more}",
              file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from interp.analysis import analyze_run, task_analysis, write_analysis
    from interp.run_report import write_run_report
    from models.memory import check_memory
    from models.runs import load_run, read_config, run_lock
    from models.train import resolve_device
    from tasks import make_task

    if not (args.run_dir / "model.safetensors").exists():
        raise ConfigError(f"{args.run_dir} holds no trained model (model.safetensors); train it first")
    device = resolve_device(args.device, setting="analyze --device")
    cfg = read_config(args.run_dir)
    try:
        check_memory(cfg, make_task(cfg.task), device, purpose="analyze", n_samples=args.samples)
    except ConfigError as err:
        raise ConfigError(f"{args.run_dir / 'config.json'}: {err}") from None
    bootstrap = getattr(args, "bootstrap", 0)
    if bootstrap and (bootstrap < 2 or getattr(args, "timeline", False)):
        raise ConfigError(f"--bootstrap {bootstrap}: give 2 or more resamples, and not with --timeline")
    if getattr(args, "timeline", False):
        return _analyze_timeline(args, device)
    with run_lock(args.run_dir):  # a folder in training is refused, naming the trainer; nothing it writes is overwritten
        run = load_run(args.run_dir, device=device)
        analysis = analyze_run(run, n_samples=args.samples, seed=args.seed, device=device, bootstrap=bootstrap)
        json_path = write_analysis(run, analysis)
        report_path = write_run_report(run, analysis=analysis)
    print(task_analysis(analysis.task).headline(analysis.verdict))
    print(f"wrote {json_path} and {report_path} in {analysis.seconds:.0f} s on {device.type}")
    return 0


def _analyze_timeline(args: argparse.Namespace, device) -> int:
    """`analyze --timeline`: every snapshot analysed (interp/timeline.py), timeline.json and the
    report rewritten with its section. The snapshots are checked before anything is written."""
    from interp.run_report import write_run_report
    from interp.timeline import analyze_timeline, moments, write_timeline
    from models.runs import load_run, run_lock

    with run_lock(args.run_dir):
        run = load_run(args.run_dir, device=device)
        moments(run.path)  # no snapshots, or a damaged index: exit 2 before the analysis starts
        timeline = analyze_timeline(run, seed=args.seed, device=device, progress=not args.no_progress)
        path = write_timeline(run.path, timeline)
        report_path = write_run_report(run)
    summary = timeline["summary"]
    changes = ", ".join(f"{c['from']} -> {c['to']} at step {c['step']}" for c in summary["changes"]) or "none"
    print(f"{summary['final_label']}, decided at step {summary['decided_at']} ({len(timeline['points'])} moments; "
          f"changes: {changes})")
    print(f"wrote {path} and {report_path} in {timeline['seconds']:.0f} s on {device.type}")
    return 0


_ANALYZE_MODEL_HELP = """Patching, path patching, the circuit graph, head scores and the report on any
TransformerLens HookedTransformer, with your own clean/corrupted prompt pairs and no project task
(docs/outside-models.md). FUNCTION() takes no arguments and returns the model; the pairs file
holds {"pairs": [{"clean", "corrupted", "answer", "wrong_answer"}, ...]} with optional "vocab"
and "prepend_bos". Writes OUT/analysis.json and OUT/report.html. Example:
  workbench analyze-model --model analyses/examples/induction.py:build \\
      --prompts analyses/examples/induction_pairs.json --out runs/induction"""


def _cmd_analyze_model(args: argparse.Namespace) -> int:
    from analyses.outside import analyze_outside, summary_lines
    from models.train import resolve_device

    device = resolve_device(args.device, setting="analyze-model --device")
    analysis, written = analyze_outside(args.model, args.prompts, args.out, device, seed=args.seed)
    print("\n".join(summary_lines(analysis)))
    print(f"wrote {' and '.join(map(str, written))} in {analysis.seconds:.1f} s on {device.type}")
    return 0


def _seed_list(raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a comma-separated list of integers") from None


def _gamma_pair(raw: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in raw.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not two comma-separated init rates, e.g. 0.5,0.8") from None


def _cmd_study(args: argparse.Namespace) -> int:
    from analyses.study import all_studies, run_study

    if args.list or not args.name:
        for name, study in sorted(all_studies().items()):
            print(f"{name:28s} {study.summary}")
        return 0 if args.list else EXIT_CONFIG
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be >= 1")
    started = time.perf_counter()
    results = run_study(args.name, args.out, args.scale, workers=args.workers, backend=args.backend,
                        address=args.address, progress=not args.no_progress, seeds=args.seeds,
                        overrides=args.overrides, gammas=args.gammas, protocol=args.protocol, ensemble=args.ensemble)
    print(json.dumps(results.get("headline", {}), default=str))
    print(f"study {args.name} ({args.scale}) finished in {time.perf_counter() - started:.0f} s; "
          f"see {results.get('report', 'its folder')}")
    return 0


_SWEEP_HELP = """Train every combination of the --grid values on top of a preset. Each cell is an ordinary
run folder under --out (named like init_gamma=0.3__n_layers=2__seed=0), next to sweep.json (the
index: grid, status, wall time and final metrics per cell) and report.html. Re-running the same
command skips finished (and diverged) cells, resumes killed ones and retries failed ones.
Exit status 1 when some cell failed or its folder was busy (re-run to retry), 2 when a cell's folder
holds a damaged file or another run (a re-run cannot fix it: the message names the file). Killed
in any way, the sweep's workers die with it (Linux), and the same command resumes it. Example:
  workbench sweep --preset composite-cpu --grid model.init_gamma=0.3,0.5 model.n_layers=2,3 \\
      train.seed=0,1 --out runs/sweeps/x"""


def _cmd_sweep(args: argparse.Namespace) -> int:
    from analyses.sweep import check_ray_address, grid_cells, machine_cores, parse_grid, run_sweep
    from models.presets import get_preset
    from models.runs import run_lock

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be >= 1")
    if args.address and args.backend != "ray":
        raise ConfigError("--address needs --backend ray")
    _load_tasks()  # a task's module in interp/tasks/ may register presets
    base = get_preset(args.preset).with_overrides(args.overrides)
    grid = parse_grid(args.grid)
    cells = grid_cells(base, grid)  # every cell's config is valid before the folder is made (and locked)
    if not args.address:  # cells on this machine: they must fit in its memory, `workers` at once
        _check_cells_memory(cells, min(len(cells), args.workers or machine_cores()))
    if args.address:
        check_ray_address(args.address)  # so is the cluster's address (within seconds)
    with run_lock(args.out):  # one sweep per folder: a second one exits 2 at once, naming the first, and changes nothing
        index = run_sweep(base, grid, args.out, preset=args.preset, workers=args.workers,
                          backend=args.backend, address=args.address, progress=not args.no_progress,
                          ensemble=args.ensemble)
    print(f"sweep of {len(index['cells'])} cells: {json.dumps(index['counts'])} in {index['wall_seconds']:.0f} s; "
          f"see {args.out / 'sweep.json'} and {args.out / 'report.html'}")
    for name, cell in index["cells"].items():
        if cell.get("status") == "failed":
            print(f"workbench sweep: cell {name} failed: {((cell.get('error') or '').strip().splitlines() or [''])[-1]}",
                  file=sys.stderr)
    if any(cell.get("refused") for cell in index["cells"].values()):
        return EXIT_CONFIG  # a damaged cell folder: running the sweep again cannot fix it
    return 1 if index["counts"].get("failed") else 0


def _check_cells_memory(cells: dict, at_once: int) -> None:
    """Refuse a sweep whose cells, `at_once` of them training together, do not fit in memory."""
    from models.memory import check_memory
    from models.train import resolve_device
    from tasks import make_task

    for cfg in cells.values():
        check_memory(cfg, make_task(cfg.task), resolve_device(cfg.train.device), copies=at_once)


def _cmd_presets(args: argparse.Namespace) -> int:
    from models.presets import PRESETS

    _load_tasks()  # a task's module in interp/tasks/ may register presets
    for name, make in PRESETS.items():
        print(f"== {name}: {(make.__doc__ or '').strip().splitlines()[0]}")
        print(make().to_json())
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from analyses.zoo import ZOO, ZOO_DIR, build, status, zoo_entry

    zoo_dir = args.dir or ZOO_DIR
    if args.action == "list":
        if args.names:
            raise ConfigError("workbench zoo list takes no names; use workbench zoo build NAME ...")
        for entry in ZOO.values():
            print(f"{entry.name:24s} {entry.origin:12s} {status(entry.name, zoo_dir):8s} {entry.about}")
            sets = " ".join(f"--set '{o}'" for o in entry.overrides)
            same = (f"workbench curriculum {entry.curriculum} --out runs/zoo-stages/{entry.name} {sets}, the last stage"
                    if entry.curriculum else f"workbench train --preset {entry.preset} {sets}")
            print(f"{'':24s} rebuild: {entry.command()}  (= {same.rstrip()})")
        return 0
    names = args.names or list(ZOO)
    for name in names:
        zoo_entry(name)  # every name checked before anything trains
    for name in names:
        started = time.perf_counter()
        print(f"zoo: building {name} ({zoo_entry(name).about})")
        print(f"zoo: {build(name, zoo_dir, progress=not args.no_progress, device=args.device)} in {time.perf_counter() - started:.0f} s")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    if args.ensemble is not None:
        from analyses.bench_ensemble import run_ensemble_benchmark

        run_ensemble_benchmark(args.ensemble, args.device or "cpu", quick=args.quick)
        return 0
    if args.snapshots:
        from analyses.bench_snapshots import run_snapshot_benchmark

        _load_tasks()
        run_snapshot_benchmark(quick=args.quick)
        return 0
    if args.patching and args.device:
        raise ConfigError(f"--patching times the run's own model on the CPU; drop --device {args.device} "
                          "(--device alone times the same sweep on a fresh lego-gpu model on that device)")
    if args.patching:
        from analyses.bench_patching import agreement_at_init, print_report, run_patching_benchmark
        from models.runs import load_run

        run = load_run(args.patching)
        repeats = 1 if args.quick else 3
        results = run_patching_benchmark(run.model, run.task, repeats=repeats, label_index=args.label_index)
        print_report({**results, **agreement_at_init(run, 32, 0, args.label_index)})
        return 0
    from analyses.benchmark import run_benchmarks, run_device_benchmark
    from models.train import resolve_device

    if args.device:
        run_device_benchmark(resolve_device(args.device, setting="benchmark --device"), quick=args.quick)
        return 0
    run_benchmarks(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
