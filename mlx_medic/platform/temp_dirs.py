"""Where `mlx.launch`'s `mktemp` files land: the launch user's temp dir.

The launcher's rank script runs a bare `mktemp` for its pid file and hostfiles.
On macOS that uses `_CS_DARWIN_USER_TEMP_DIR` (`/var/folders/<xx>/<hash>/T/`)
and ignores `$TMPDIR` (macos-facts.md §5); on Linux it uses `$TMPDIR`, else
/tmp. The answer is for the user this process runs as: an exporter running as
another user than the launcher must be given `launch_temp_dirs` in the
inventory.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from mlx_medic.platform.commands import (
    CommandError,
    ParseError,
    Runner,
    output_of,
    run_command,
)

log = logging.getLogger("mlx_medic.platform")

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
    """The default directories to look in for mlx.launch's leftover files."""
    environ = os.environ if environ is None else environ
    if platform == "darwin":
        try:
            return [parse_darwin_user_temp_dir(
                output_of(runner, ["getconf", "DARWIN_USER_TEMP_DIR"], GETCONF_TIMEOUT)
            )]
        except (CommandError, ParseError) as exc:
            log.warning("cannot find the user temp dir (%s); looking in $TMPDIR and /tmp", exc)
    return posix_temp_dirs(environ)
