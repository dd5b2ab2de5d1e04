"""Run a platform tool with a fixed argv and a timeout, never through a shell.

Collectors take a `Runner` so tests can feed verbatim macOS outputs on Linux;
the real runner is `run_command`. A missing tool is its own error type because
"this host has no ibv_devinfo" means "no series", while a tool that fails or
hangs is a collector failure.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_OUTPUT_CHARS = 1_000_000  # a tool that floods stdout is garbage, not data


@dataclass(frozen=True)
class CompletedCommand:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(RuntimeError):
    """The command could not give an answer; the message names it and why."""


class CommandNotFound(CommandError):
    """The tool is not installed on this host (normal for macOS tools on Linux)."""


class CommandTimeout(CommandError):
    """The command did not finish in time; `stdout` is what it printed until then."""

    def __init__(self, message: str, stdout: str):
        super().__init__(message)
        self.stdout = stdout


class ParseError(ValueError):
    """A tool printed something we do not recognise; the message quotes it."""


Runner = Callable[[Sequence[str], float], CompletedCommand]


def _quote(argv: Sequence[str]) -> str:
    return " ".join(argv)


def run_command(
    argv: Sequence[str], timeout: float, *, user: str | None = None
) -> CompletedCommand:
    """Run `argv` (no shell) and return its output, killing it after `timeout` s.

    Output is decoded as UTF-8 with replacement, so binary garbage becomes a
    parse error later instead of a crash here. `LC_ALL=C` keeps tool output in
    the format the parsers were written against. `user`: run it as that user
    (the process must be root), for answers that depend on who asks.
    """
    argv = tuple(argv)
    env = dict(os.environ, LC_ALL="C")
    try:
        completed = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
            user=user,
        )
    except FileNotFoundError as exc:
        raise CommandNotFound(f"{argv[0]} is not installed on this host") from exc
    except subprocess.TimeoutExpired as exc:
        printed = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else ""
        raise CommandTimeout(
            f"`{_quote(argv)}` did not finish within {timeout:g}s", printed[:MAX_OUTPUT_CHARS]
        ) from exc
    except (OSError, KeyError) as exc:  # KeyError: no such user
        who = f" as {user}" if user else ""
        raise CommandError(f"`{_quote(argv)}` could not run{who}: {exc}") from exc
    return CompletedCommand(
        argv=argv,
        returncode=completed.returncode,
        stdout=completed.stdout.decode("utf-8", "replace")[:MAX_OUTPUT_CHARS],
        stderr=completed.stderr.decode("utf-8", "replace")[:MAX_OUTPUT_CHARS],
    )


def as_user(user: str) -> Runner:
    """A runner whose commands run as `user` (needs root)."""
    return functools.partial(run_command, user=user)


def output_of(runner: Runner, argv: Sequence[str], timeout: float) -> str:
    """The command's stdout; a non-zero exit is a `CommandError` quoting stderr."""
    result = runner(argv, timeout)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        said = f": {detail[0][:200]}" if detail else ""
        raise CommandError(f"`{_quote(argv)}` exited with status {result.returncode}{said}")
    return result.stdout


def excerpt(text: str, limit: int = 80) -> str:
    """A short, printable quote of tool output for error messages."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return repr(first[:limit]) if first else "nothing"
