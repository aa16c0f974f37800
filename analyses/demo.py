"""`workbench demo`'s run folder checks, and the zoo's learned model analyzed and linked beside the demo's run."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from tasks import ConfigError


def check_demo_folder(out: Path) -> None:
    """The demo trains into a new or empty folder, or replaces a run of its own (`_is_demo_run`);
    any other run is refused, never deleted."""
    from models.runs import DEMO, RUN_FILES, RunFolder, is_own_temp

    if not _is_demo_run(out):
        folder = RunFolder(out, named_by="--out")
        folder.check_usable()
        if folder.holds_run():
            raise ConfigError(f"--out {out} holds a run that is not a demo run (no {DEMO} recording its config); the demo "
                              f"replaces only its own runs: choose another folder, or delete that run yourself")
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in RUN_FILES and not is_own_temp(p.name))
    if others:
        raise ConfigError(f"--out {out} holds files that are not a run's ({', '.join(others[:5])}); choose a new or empty folder")


def _is_demo_run(out: Path) -> bool:
    """Whether `out` holds a run the demo wrote: its demo.json records the config that its
    config.json holds (or the demo stopped before writing config.json)."""
    from models.runs import CONFIG, DEMO, read_config, read_json

    try:
        recorded = read_json(out / DEMO)
        return not (out / CONFIG).exists() or read_config(out).to_dict() == recorded["config"]
    except (OSError, ValueError, TypeError, KeyError, ConfigError):  # no marker, or a damaged one or config
        return False


DEMO_LEARNED = "lego-three-hops"  # the zoo model whose analysis the demo's report links to


def demo_learned(out: Path, analyze: Callable[[argparse.Namespace], int]) -> Path | None:
    """Beside the demo run (whose association heads are planted), analyze a copy of the zoo's
    learned three-hop LEGO model in OUT-learned (under a minute), and link the two reports. The
    copy is made under a temporary name and renamed, so an interrupted copy is never taken for one.
    `analyze`: the `workbench analyze` command (analyses.cli's), given its parsed arguments."""
    from analyses.zoo import zoo_path
    from models.runs import CONFIG, read_regular

    source, learned = zoo_path(DEMO_LEARNED), out.with_name(f"{out.name}-learned")
    if learned.exists() and (not (learned / CONFIG).is_file()
                             or read_regular(learned / CONFIG) != read_regular(source / CONFIG)):
        print(f"warning: {learned} holds something other than a copy of zoo/{DEMO_LEARNED}; the learned model's "
              "report is not written", file=sys.stderr)
        return None
    if not learned.exists():
        partial = learned.with_name(f".{learned.name}.copying")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        partial.rename(learned)
    analyze(argparse.Namespace(run_dir=learned, samples=512, seed=0, device="cpu"))
    _link_reports(out, learned)
    return learned


def _link_reports(planted: Path, learned: Path) -> None:
    """Rewrite both reports with a paragraph after the summary that points at the other."""
    from interp.run_report import build_run_report
    from models.runs import REPORT, load_run, run_lock

    notes = {planted: (learned, "This model's association heads are planted. For heads that were learned, with nothing "
                                "planted or mimicked, see"),
             learned: (planted, f"A copy of zoo/{DEMO_LEARNED}: a plain model taught three association hops by the "
                                "lego-three-hops curriculum. For the demo's model, whose association heads are planted, see")}
    for run_dir, (other, words) in notes.items():
        with run_lock(run_dir):
            report = build_run_report(load_run(run_dir))
            report.sections.insert(1, ("See also", f'<p>{words} <a href="../{other.name}/report.html">'
                                                   f"{other.name}/report.html</a>.</p>"))
            report.write(run_dir / REPORT)
