"""`mlx-medic node pid-alive PID [--start-time T]`: does process PID, started at T, still
live on this node? Asked here because a pid means something only in its own PID
namespace on its own machine (the model lock's holder is judged on the holder's node).

Answers with `ps` (processes.pid_liveness: the same reading on Linux and macOS): alive, dead (gone
or a zombie), reused (the pid lives but started at another time: another process) or
unknown (ps answered in a way that cannot be read; the caller counts it as alive).
"""

from __future__ import annotations

import argparse

from mlx_medic.node.cli import EXIT_OK, add_node_arguments, emit, node_context
from mlx_medic.processes.pid_liveness import local_liveness


def _pid(value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a process id")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=_pid, metavar="PID", help="a process id on this node")
    parser.add_argument(
        "--start-time",
        type=float,
        default=None,
        metavar="UNIX_TIME",
        help="its start; another start means a reused pid",
    )
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    liveness, why = local_liveness(args.pid, args.start_time)
    document = {
        "pid": args.pid,
        "start_time": args.start_time,
        "liveness": str(liveness),
        "why": why,
    }
    emit("pid-alive", document, args.json, f"pid {args.pid} on {context.node}: {why}")
    return EXIT_OK
