"""The `workbench` parser: the top-level options, then one subcommand per module of this package,
in the order `workbench --help` lists them. Each module adds its own subparser (`add_parser`),
whose `run(args)` the parsed arguments carry."""

from __future__ import annotations

import argparse

from analyses.cli import (
    analyze,
    analyze_model,
    benchmark,
    circuit,
    curriculum,
    demo,
    presets,
    report,
    study,
    sweep,
    train,
    zoo,
)

# circuit adds two commands: circuit-export and circuit-compare
COMMANDS = (train, demo, curriculum, analyze, analyze_model, report, study, sweep, presets, zoo, benchmark, circuit)
_DESCRIPTION = ("Train small transformers on synthetic reasoning tasks and look inside them. "
                "Exit status: 0 done, 1 unexpected error (traceback saved; --debug prints it), 2 bad configuration "
                "(nothing written), 3 training diverged, 4 could not write (disk full, permission denied).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=_DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser
