"""What every `mlx-medic` command shares on its command line: one-line errors, the exit
codes (docs/exit-codes.md), `--version`, `--inventory` and the `--log.*` flags.

Imports only the standard library's argparse: `mlx-medic node ...` runs on every step of
every remediation and must start light.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mlx_medic.file_problems import FileProblems

# The exit codes every command keeps (docs/exit-codes.md has the table, with each
# command's own codes from 3 up).
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and could not do its job (the reason on stderr)
EXIT_USAGE = 2  # it could not start as asked: a flag, a file, a name; fix and run again
EXIT_BUSY = 3  # what it needs is held by another: the listen address, the model, its lock

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class CommandError(Exception):
    """A failure said in one line: `main` prints `mlx-medic COMMAND: message` on stderr and
    exits with `exit_code`, no traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CommandParser(argparse.ArgumentParser):
    """argparse with its error in one line (usage is one `--help` away) and `--version`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.add_help:
            self.add_argument("--version", action=VersionAction)

    def error(self, message: str) -> Any:  # argparse calls this and expects it not to return
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every add_argument (to check its metavar), and a
        # formatter given no width imports shutil (with zlib, bz2 and lzma) for the
        # terminal's: a few ms of every node helper's start, for a width it never prints.
        return self.formatter_class(prog=self.prog, width=help_width())  # type: ignore[call-arg]


def help_width() -> int:
    """argparse's own help width, `shutil.get_terminal_size().columns - 2`, without shutil:
    $COLUMNS, else standard output's terminal, else 80 columns."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


class VersionAction(argparse.Action):
    """`--version`: the installed mlx-medic's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, nargs=0, help="print mlx-medic's version"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"mlx-medic {version()}")
        parser.exit(EXIT_OK)


def version() -> str:
    from mlx_medic import __version__

    return __version__


class DeprecatedFlag(argparse.Action):
    """An old spelling still accepted: stores like the new one and says on stderr what to
    write instead (once per flag)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, instead: str, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: warning: {option_string} is deprecated here; use {self.instead}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_inventory_flag(
    parser: argparse.ArgumentParser | Any, help: str, default: Path | None = None
) -> None:
    """`--inventory FILE` (dest `inventory`). `--config.file` meant the inventory for these
    commands before; it stays as a deprecated alias, since deployed services and keys still
    say it. `parser` may be an argument group."""
    parser.add_argument("--inventory", type=Path, default=default, metavar="FILE", help=help)
    parser.add_argument(
        "--config.file",
        dest="inventory",
        type=Path,
        default=default,
        metavar="FILE",
        action=DeprecatedFlag,
        instead="--inventory FILE (--config.file is the remediator's own config)",
        help=argparse.SUPPRESS,
    )


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """`--log.level`, `--log.format` and `--log.file` of a long-running command
    (mlx_medic.logs)."""
    parser.add_argument(
        "--log.level",
        dest="log_level",
        choices=LOG_LEVELS,
        default="info",
        help="the least severe lines logged (default info); debug adds the SSH library's"
        " line per connection and command",
    )
    parser.add_argument(
        "--log.format",
        dest="log_format",
        choices=LOG_FORMATS,
        default="text",
        help="text for people (default), json: one object per line for log shippers",
    )
    parser.add_argument(
        "--log.file",
        dest="log_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="append the log to FILE, reopened when it is rotated (renamed or removed);"
        " default stderr",
    )


def file_error(exc: Exception, exit_code: int = EXIT_USAGE) -> CommandError:
    """A file that cannot be used (an InventoryError, a ConfigError) as FileProblems says
    it: one line, or every problem a line each with its place."""
    return CommandError(exc.said() if isinstance(exc, FileProblems) else str(exc), exit_code)


def unknown_model(name: str, known: Iterable[str], source: object) -> CommandError:
    """A model the inventory does not name, and the ones it does."""
    return CommandError(f"no model {name!r} in {source} (models: {', '.join(known)})")


def listen_error(exc: OSError, address: str, flag: str = "--web.listen-address") -> CommandError:
    """A refused bind in one line: in use is EXIT_BUSY (another holds it), anything else
    EXIT_USAGE (choose another address)."""
    # aiohttp's strerror holds its own sentence around the system's; say the system's
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EADDRINUSE:
        return CommandError(
            f"cannot listen on {address}: {why}: another process listens there; stop it"
            f" or choose another address with {flag}",
            EXIT_BUSY,
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return CommandError(
            f"cannot listen on {address}: {why}: this user may not bind that port (below"
            f" 1024 needs privileges); choose another with {flag}"
        )
    return CommandError(f"cannot listen on {address}: {why}; check {flag}")
