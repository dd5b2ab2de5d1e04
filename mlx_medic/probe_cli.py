"""`mlx-medic probe --host H --port P`: one health probe from this node, as one JSON line.

The remediator runs it on a model's head node over SSH when the model listens on
loopback: probed from the remediator's own machine, 127.0.0.1 is the wrong machine,
and "connection refused" there would read as down. The exit status carries the
verdict for scripts; the JSON line carries the reason for on-call.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mlx_medic.health import ProbeResult, probe_model
from mlx_medic.state_layout import StateFileError, ensure_dir

EXIT_UP = 0
EXIT_DOWN = 1
EXIT_BAD_ARGUMENTS = 2  # argparse's own status for a bad command line
EXIT_INCONCLUSIVE = 3
DEFAULT_TIMEOUT = 10.0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="address the model's server listens on")
    parser.add_argument("--port", required=True, type=_port, help="the server's port")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds for the whole completion request (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--lock-dir",
        type=Path,
        default=None,
        help="directory of the node-wide probe locks (the exporter's <state_dir>/locks), so"
        " this probe never overlaps another of the same server",
    )


def _exit_status(result: ProbeResult) -> int:
    if not result.conclusive:
        return EXIT_INCONCLUSIVE
    return EXIT_UP if result.up else EXIT_DOWN


def run(args: argparse.Namespace) -> int:
    lock_dir: Path | None = args.lock_dir
    try:
        if lock_dir is not None:  # the state dir's layout: the exporter's and ours alike
            ensure_dir(lock_dir)
        result = probe_model(args.host, args.port, timeout=args.timeout, lock_dir=lock_dir)
    except StateFileError as exc:  # a lock dir or file this user may not use: no probe
        print(f"mlx-medic probe: cannot use --lock-dir {lock_dir}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except ValueError as exc:  # a host that is no host name or address
        print(f"mlx-medic probe: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    print(
        json.dumps(
            {
                "up": result.up,
                "conclusive": result.conclusive,
                "reason": result.reason,
                "latency_seconds": round(result.latency_seconds, 6),
            }
        ),
        flush=True,
    )
    return _exit_status(result)
