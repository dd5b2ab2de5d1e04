"""launchd's restart throttle for a supervisord program: `python -m testbed.throttle
--every SECONDS --stamp FILE -- COMMAND...` waits until SECONDS have passed since the last
spawn it recorded in FILE, records this one, and becomes COMMAND (exec: supervisord keeps
signalling the service itself).

launchd spawns a KeepAlive job at most once every ThrottleInterval seconds (10 by
default), so a job that died at once waits the rest; one that ran longer restarts at
once. supervisord has no such throttle (it restarts at once, or backs off only for
programs that die before `startsecs`), so a testbed that plays launchd with supervisord
puts this in front of the service's command.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path


def wait_for_turn(
    stamp: Path,
    every: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Sleep until `every` seconds after the last recorded spawn; record this one. Returns
    the seconds slept."""
    try:
        last = float(stamp.read_text().strip() or 0.0)
    except (OSError, ValueError):
        last = 0.0
    waited = max(0.0, last + every - clock())
    if waited:
        sleep(waited)
    stamp.write_text(f"{clock():.6f}\n")
    return waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.throttle", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--every", type=float, required=True, help="seconds between spawns")
    parser.add_argument("--stamp", type=Path, required=True, help="the last spawn's time")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    waited = wait_for_turn(args.stamp, args.every)
    if waited:
        print(
            f"testbed.throttle: waited {waited:.1f}s (at most one spawn every {args.every:g}s)",
            file=sys.stderr,
            flush=True,
        )
    os.execvp(command[0], command)
    return 70  # not reached


if __name__ == "__main__":
    sys.exit(main())
