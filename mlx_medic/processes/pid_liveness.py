"""Is process PID, started at T, still alive on this node? Asked on the holder's node,
nowhere else (the node helper `pid-alive` runs this there).

A pid means something only in its own PID namespace and on its own machine: the
testbed's nodes share one host name, and a real cluster's nodes each have their own
pid 4711. So the question runs on the node as one fixed argv, the pid an argument of
its own:

    env LC_ALL=C TZ=UTC0 ps -p PID -o stat= -o lstart=

`ps` is there on every macOS and Linux node, unlike an interpreter with our package.
`lstart` (in C locale and UTC, so it parses the same everywhere) is the process's
start in whole seconds; a live pid whose start differs from the one the holder
recorded is a reused pid: another process, and the holder is gone. A zombie is gone.
"""

from __future__ import annotations

import calendar
import time
from enum import StrEnum

from mlx_medic.platform.commands import CommandError, CommandTimeout, run_command
from mlx_medic.transport.interface import CommandResult

CHECK_TIMEOUT = 10.0
# `lstart` has whole seconds and a start time recorded in Python has a fraction:
# starts this close are the same process (a pid is not reused within two seconds).
START_TOLERANCE = 2.0
LSTART_FORMAT = "%a %b %d %H:%M:%S %Y"


class Liveness(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    REUSED = "reused"  # the pid lives, but it is another process (started at another time)
    UNKNOWN = "unknown"  # the node answered, but not in a way we can read


def liveness_argv(pid: int) -> list[str]:
    """The command that asks a node about `pid` (always the same words but the pid)."""
    if pid <= 0:
        raise ValueError(f"a process id is positive, not {pid}")
    return ["env", "LC_ALL=C", "TZ=UTC0", "ps", "-p", str(pid), "-o", "stat=", "-o", "lstart="]


def parse_lstart(text: str) -> float:
    """`Tue Dec  1 00:26:32 2026` (UTC, C locale) as a Unix time; ValueError otherwise."""
    return float(calendar.timegm(time.strptime(text.strip(), LSTART_FORMAT)))


def judge_ps(result: CommandResult, pid_start: float | None) -> tuple[Liveness, str]:
    """What the node's `ps` answer says about the process, and why (for the log)."""
    out = result.stdout.strip()
    if result.exit_status == 1 and not out:
        return Liveness.DEAD, "no such process"
    if result.exit_status != 0 or not out:
        why = "timed out" if result.timed_out else f"exit status {result.exit_status}"
        detail = (result.stderr.strip() or out)[:200]
        return Liveness.UNKNOWN, f"ps {why}: {detail}" if detail else f"ps {why}"
    stat, _, lstart = out.partition(" ")
    if stat.startswith("Z"):
        return Liveness.DEAD, "a zombie (exited, not yet reaped)"
    if pid_start is None:
        return Liveness.ALIVE, "alive (no start time recorded to compare)"
    try:
        started = parse_lstart(lstart)
    except ValueError:
        return Liveness.UNKNOWN, f"ps printed a start time we cannot read: {out[:200]!r}"
    if abs(started - pid_start) > START_TOLERANCE:
        return Liveness.REUSED, (
            f"the pid now belongs to a process started at {started:.0f},"
            f" not the holder's {pid_start:.0f}"
        )
    return Liveness.ALIVE, "alive"


def local_liveness(
    pid: int, pid_start: float | None, timeout: float = CHECK_TIMEOUT
) -> tuple[Liveness, str]:
    """Whether `pid` (started at `pid_start`, if known) still lives on this machine."""
    argv = liveness_argv(pid)
    try:
        done = run_command(argv, timeout)
    except CommandTimeout:
        return judge_ps(CommandResult(None, "", "", timed_out=True), pid_start)
    except CommandError as exc:
        return Liveness.UNKNOWN, f"cannot run ps: {exc}"
    return judge_ps(CommandResult(done.returncode, done.stdout, done.stderr), pid_start)
