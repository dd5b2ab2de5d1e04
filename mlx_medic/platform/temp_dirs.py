"""Where `mlx.launch`'s `mktemp` files land: the launching user's temp dir.

The launcher's rank script runs a bare `mktemp` for its pid file and hostfiles,
as the user the model's service runs as (on the peers: the user its ssh logs in
as). On macOS that uses `_CS_DARWIN_USER_TEMP_DIR` (`/var/folders/<xx>/<hash>/T/`)
and ignores `$TMPDIR` (sources in docs/decisions.md). That dir is per user: `confstr` (and
`getconf DARWIN_USER_TEMP_DIR`) answers for the user who asks, and root gets its
own (`/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/`), so an exporter running
as root asks `getconf` as the service's user. On Linux `mktemp` uses `$TMPDIR`,
else /tmp: our own `$TMPDIR` is known, another user's is not, so for them it is
the default, /tmp.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from mlx_medic.log_on_use import logger
from mlx_medic.platform.commands import (
    CommandError,
    ParseError,
    Runner,
    as_user,
    output_of,
    run_command,
)

LOGGER = "mlx_medic.platform"  # mlx_medic.log_on_use: logging is imported when it logs

GETCONF_ARGV = ("getconf", "DARWIN_USER_TEMP_DIR")
GETCONF_TIMEOUT = 5.0


def parse_darwin_user_temp_dir(text: str) -> Path:
    """The path `getconf DARWIN_USER_TEMP_DIR` printed (one absolute path)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("/"):
        raise ParseError(
            f"getconf DARWIN_USER_TEMP_DIR printed {text[:200]!r}, not one absolute path"
        )
    return Path(lines[0].strip())


def posix_temp_dirs(environ: Mapping[str, str]) -> list[Path]:
    """GNU mktemp's choice ($TMPDIR, else /tmp), plus /tmp for ranks started without TMPDIR."""
    found: list[Path] = []
    tmpdir = environ.get("TMPDIR", "")
    if tmpdir.startswith("/"):
        found.append(Path(tmpdir))
    if Path("/tmp") not in found:
        found.append(Path("/tmp"))
    return found


def launch_temp_dirs(
    platform: str = sys.platform,
    runner: Runner = run_command,
    environ: Mapping[str, str] | None = None,
) -> list[Path]:
    """Where mlx.launch's files land when it runs as the user this process runs as."""
    environ = os.environ if environ is None else environ
    if platform == "darwin":
        try:
            return [parse_darwin_user_temp_dir(output_of(runner, GETCONF_ARGV, GETCONF_TIMEOUT))]
        except (CommandError, ParseError) as exc:
            logger(LOGGER).warning(
                "cannot find the user temp dir (%s); looking in $TMPDIR and /tmp", exc
            )
    return posix_temp_dirs(environ)


def current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def user_temp_dirs(
    users: Iterable[str | None],
    platform: str = sys.platform,
    runner: Runner = run_command,
    runner_as: Callable[[str], Runner] = as_user,
    environ: Mapping[str, str] | None = None,
    me: Callable[[], str] = current_user,
) -> list[Path]:
    """Where mlx.launch's files land for each of `users` (None: the user this process
    runs as), in order, each dir once. A macOS user whose dir cannot be asked for (no
    such user; an exporter that is neither root nor that user) is logged and left out."""
    found: list[Path] = []
    for user in dict.fromkeys(users):
        if user is None or user == me():
            dirs = launch_temp_dirs(platform, runner, environ)
        elif platform == "darwin":
            try:
                text = output_of(runner_as(user), GETCONF_ARGV, GETCONF_TIMEOUT)
                dirs = [parse_darwin_user_temp_dir(text)]
            except (CommandError, ParseError) as exc:
                logger(LOGGER).warning(
                    "cannot find %s's temp dir, its launch leftovers are not counted: %s", user, exc
                )
                dirs = []
        else:
            dirs = [Path("/tmp")]
        found += [d for d in dirs if d not in found]
    return found
