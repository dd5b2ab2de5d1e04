"""One process's identity, read afresh: pid, start time, command line (and its state).

A pid alone names a process only until it exits: the number is then free for the next
`fork`. Whoever signals a process it listed earlier reads this again right before the
signal and signals only if nothing changed, so a reused pid is never hit. The start time
is computed as this platform's process table computes it (Linux: boot time plus the
start in clock ticks; macOS: psutil), so the two compare exactly.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

from mlx_medic.processes.info import State


@dataclass(frozen=True)
class Identity:
    pid: int
    start_time: float
    cmdline: tuple[str, ...]
    state: State  # not part of the identity: what the process is doing now

    def same_process(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        # Start times come from one formula; a tick (10 ms) of slack covers float rounding.
        return (
            self.pid == pid
            and abs(self.start_time - start_time) < 0.005
            and self.cmdline == cmdline
        )


@functools.cache  # a failure raises, so it is not kept: the next call reads again
def _linux_clock() -> tuple[float, int]:
    """(boot time, clock ticks per second), as LinuxProcessTable reads them."""
    from mlx_medic.platform.proc_linux import read_boot_time

    return read_boot_time(), os.sysconf("SC_CLK_TCK")


def _linux_identity(pid: int) -> Identity | None:
    from mlx_medic.platform.proc_linux import parse_cmdline, parse_stat

    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = parse_stat(handle.read())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = parse_cmdline(handle.read())
        boot, ticks = _linux_clock()
    except (OSError, ValueError):
        return None
    return Identity(pid, boot + stat.starttime / ticks, cmdline, stat.state)


def _macos_identity(pid: int) -> Identity | None:
    """psutil for the start and argv (as MacProcessTable has them), `ps` for the state:
    only its letter says uninterruptible (`U`)."""
    import subprocess

    import psutil

    from mlx_medic.platform.proc_macos import PsParseError, parse_ps_stat

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            start, cmdline = proc.create_time(), tuple(proc.cmdline())
        stat = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, timeout=10
        ).stdout
        state = parse_ps_stat(stat) if stat.strip() else None
    except (psutil.Error, OSError, PsParseError, subprocess.SubprocessError):
        return None
    return Identity(pid, start, cmdline, state or State.SLEEPING)


def own_lineage() -> set[int]:
    """This process and its ancestors: what a sweep run from a rank's shell must spare."""
    found = {os.getpid()}
    pid = os.getppid()
    while pid > 0 and pid not in found:
        found.add(pid)
        pid = _parent_of(pid)
    return found


def _parent_of(pid: int) -> int:
    if sys.platform.startswith("linux"):
        from mlx_medic.platform.proc_linux import parse_stat

        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                return parse_stat(handle.read()).ppid
        except (OSError, ValueError):
            return 0
    import psutil

    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return 0


def read_identity(pid: int) -> Identity | None:
    """The process now holding `pid`, or None when there is none (or it cannot be read)."""
    if sys.platform.startswith("linux"):
        return _linux_identity(pid)
    return _macos_identity(pid)
