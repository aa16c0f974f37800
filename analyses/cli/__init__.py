"""The `workbench` command line: `main`, and the statuses it exits with. Exit status: 0 done, 1 an
unexpected error (the message names the command and where its traceback was saved; `--debug`
prints it), 2 bad configuration, arguments or run folder (nothing written), 3 training diverged
(recorded in the run's metrics.jsonl), 4 could not write (disk full, permission denied: the message
names the file). The parser is in parser.py, each command in its own module here."""

from __future__ import annotations

import errno
import sys
import traceback

from analyses.cli.common import EXIT_CONFIG, EXIT_DIVERGED, EXIT_UNEXPECTED, EXIT_WRITE
from analyses.cli.guards import NAME_MAX, check_name_lengths, check_out_link, is_write_failure, save_traceback
from analyses.cli.parser import build_parser as _parser

__all__ = ["EXIT_CONFIG", "EXIT_DIVERGED", "EXIT_UNEXPECTED", "EXIT_WRITE", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_CONFIG
    from tasks import ConfigError  # after parsing: `--help` and a usage error import nothing heavy (torch)

    try:
        check_name_lengths(args)
        check_out_link(args)
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
            print(f"workbench {args.command}: configuration error: {err.filename2 or err.filename} is a folder where "
                  f"a file belongs (or the other way round); move it away", file=sys.stderr)
            return EXIT_CONFIG
        if is_write_failure(err):
            where = getattr(err, "filename", None) or "a file of the run"
            print(f"workbench {args.command}: could not write {where}: {getattr(err, 'strerror', None) or err}. "
                  f"Free some space or fix the permissions, then run the command again (a training run continues "
                  f"from its last checkpoint with --resume)", file=sys.stderr)
            return EXIT_WRITE
        log = "" if args.debug else f" Its traceback is in {save_traceback(args)}; please report it."
        print(f"workbench {args.command}: unexpected error ({type(err).__name__}: {err}).{log}", file=sys.stderr)
        return EXIT_UNEXPECTED
