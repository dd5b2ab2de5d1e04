"""`mlx-medic probe --host H --port P`: one health probe from this node, as one JSON line.

For people and scripts on a node: the exit status carries the verdict, the JSON line
the reason. The remediator asks the same probe of a model's head through the node helper
`mlx-medic node probe MODEL` (mlx_medic.node.probe_cli), which shares this code: the
timeout's reading and the verdict's JSON (health.ProbeAnswer).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mlx_medic.health import ProbeAnswer, probe_model
from mlx_medic.state.layout import StateFileError, ensure_dir

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
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def add_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """--timeout, as both probes read it (this one and `mlx-medic node probe`)."""
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds for the whole completion request (default {DEFAULT_TIMEOUT:g})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="address the model's server listens on")
    parser.add_argument("--port", required=True, type=_port, help="the server's port")
    add_timeout_argument(parser)
    parser.add_argument(
        "--lock-dir",
        type=Path,
        default=None,
        help="directory of the node-wide probe locks (the exporter's <state_dir>/locks), so"
        " this probe never overlaps another of the same server",
    )


def _exit_status(answer: ProbeAnswer) -> int:
    if not answer.conclusive:
        return EXIT_INCONCLUSIVE
    return EXIT_UP if answer.up else EXIT_DOWN


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
    answer = ProbeAnswer.of(result)
    print(json.dumps(answer.to_document()), flush=True)
    return _exit_status(answer)
