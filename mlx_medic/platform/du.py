"""GNU du as the tmp walker on Linux: the same numbers as `du -s`, at du's speed.

Weighing a tree is one `lstat` per entry; CPython's cost per `os.stat` call
made our own walk about 1.5 times slower than du on 100,000 files (see
bench/tmpwalk/RESULTS.md). So on Linux one `du` process weighs every entry of
a dir at once:

    du -x -s -B1 --time --time-style=+%s -0 -- ./tmpA ./tmpB ...

`-x` stays on one filesystem, symlinks are never followed (du's default, `-P`,
also for the arguments), `-B1` prints allocated bytes (not apparent size),
`--time` the newest mtime of anything in the tree (what staleness needs), and
`-0` ends each record with NUL so any name parses. Hard links count once across
all arguments of one run, as with `du -s a b`. du runs in the dir through
`/proc/self/fd/N`, so a dir swapped for a symlink after we opened it is not
followed. macOS's BSD du has no `--time`: there, and whenever du is missing or
fails, the caller walks in Python (`gnu_du()` returns None).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from mlx_medic.log_on_use import logger

LOGGER = "mlx_medic.platform"  # mlx_medic.log_on_use: logging is imported when it logs

DU_FLAGS = ("-x", "-s", "-B1", "--time", "--time-style=+%s", "-0")
MAX_ARGV_BYTES = 256 * 1024  # well below Linux's ARG_MAX; more entries take more runs


class DuError(RuntimeError):
    """du could not give an answer (not run, killed, or printed what we cannot parse)."""


@dataclass(frozen=True)
class DuUsage:
    """One argument's `du -s` line: allocated bytes and newest mtime in its tree."""

    bytes: int
    newest_mtime: float


@dataclass(frozen=True)
class DuRun:
    usages: dict[str, DuUsage]  # by the name as passed; absent: vanished or already counted
    errors: int  # du's complaints (unreadable dirs, vanished entries): parts not weighed


def du_argv(du: str, names: Sequence[str]) -> list[str]:
    """The argv for weighing `names` (relative to du's working dir)."""
    return [du, *DU_FLAGS, "--", *(f"./{name}" for name in names)]


def parse_du_output(stdout: bytes) -> dict[str, DuUsage]:
    """`SIZE<TAB>EPOCH<TAB>./NAME<NUL>` records, by NAME; DuError quotes a bad record."""
    usages: dict[str, DuUsage] = {}
    for record in stdout.split(b"\0"):
        if not record:
            continue
        size, _, rest = record.partition(b"\t")
        when, _, path = rest.partition(b"\t")
        if not (size.isdigit() and when.lstrip(b"-").isdigit() and path.startswith(b"./")):
            raise DuError(f"du printed a record we cannot parse: {record[:200]!r}")
        usages[os.fsdecode(path[2:])] = DuUsage(int(size), float(when))
    return usages


def _batches(names: Sequence[str]) -> list[list[str]]:
    batches: list[list[str]] = [[]]
    size = 0
    for name in names:
        cost = len(os.fsencode(name)) + 4
        if batches[-1] and size + cost > MAX_ARGV_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(name)
        size += cost
    return batches


def run_du(du: str, dir_fd: int, names: Sequence[str]) -> DuRun:
    """Weigh `names` inside the open dir `dir_fd` with one du run (more past ARG_MAX).

    Exit status 1 with records is normal (some subtree unreadable or gone: each
    complaint counts in `errors`); any other status, or no record at all from a
    failed run, is a DuError (the caller then walks in Python).
    """
    usages: dict[str, DuUsage] = {}
    errors = 0
    for batch in _batches(names):
        if not batch:
            continue
        # du flushes after every record: into files, not pipes, so we wake up once, not per line
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                returncode = subprocess.run(
                    du_argv(du, batch),
                    cwd=f"/proc/self/fd/{dir_fd}",
                    pass_fds=(dir_fd,),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    check=False,
                    env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                ).returncode
            except OSError as exc:
                raise DuError(f"cannot run {du}: {exc.strerror or exc}") from exc
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        complaints = [
            line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()
        ]
        found = parse_du_output(stdout) if returncode in (0, 1) else {}
        if returncode != 0 and not found:  # failed as a whole, not just some subtrees
            detail = complaints[-1] if complaints else "no message"
            raise DuError(f"{du} exited with status {returncode}: {detail}")
        usages.update(found)
        errors += len(complaints)
    return DuRun(usages, errors)


def probe_du(du: str) -> str | None:
    """None if `du` weighs an empty dir the way run_du needs, else why not."""
    with tempfile.TemporaryDirectory(prefix="mlx-medic-du-probe-") as probe:
        os.mkdir(os.path.join(probe, "tmpprobe"))
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
        try:
            run = run_du(du, fd, ["tmpprobe"])
        except DuError as exc:
            return str(exc)
        finally:
            os.close(fd)
    if set(run.usages) != {"tmpprobe"} or run.errors:
        return f"{du} gave {run.usages!r} for an empty dir"
    return None


@functools.cache
def gnu_du() -> str | None:
    """The path of a du that supports `--time` and `-0` (checked once), or None."""
    if not sys.platform.startswith("linux"):
        logger(LOGGER).info("tmp walk: in Python (%s's du has no --time)", sys.platform)
        return None
    du = shutil.which("du")
    if du is None:
        logger(LOGGER).warning("tmp walk: in Python (du is not installed)")
        return None
    problem = probe_du(du)
    if problem is not None:
        logger(LOGGER).warning("tmp walk: in Python (%s cannot be used: %s)", du, problem)
        return None
    logger(LOGGER).info("tmp walk: with %s", du)
    return du
