"""Checks every command's arguments pass before it runs (names the file system can hold, no --out
that links to nothing), and what the top level does with an error: is it a failed write, and
where its traceback is saved."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import traceback
from pathlib import Path


def is_write_failure(err: BaseException) -> bool:
    """Disk full, over quota, permission denied or a read-only file system; safetensors reports
    those as its own SafetensorError, with the OS message inside."""
    from models.safe_files import WRITE_ERRNOS

    if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
        return True
    text = str(err)
    return type(err).__name__ == "SafetensorError" and any(os.strerror(code) in text for code in WRITE_ERRNOS)


def save_traceback(args: argparse.Namespace) -> str:
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


def check_name_lengths(args: argparse.Namespace) -> None:
    """A path argument with a name longer than the file system takes is refused up front, naming
    the option: the file system's own error comes from wherever the name is first used."""
    from tasks import ConfigError

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


def check_out_link(args: argparse.Namespace) -> None:
    """An --out that is a symbolic link to nothing would create the link's far-away target."""
    from tasks import ConfigError

    out = getattr(args, "out", None)
    if isinstance(out, Path) and out.is_symlink() and not out.exists():
        raise ConfigError(f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist; the workbench "
                          f"does not create a link's target. Name a real folder")
