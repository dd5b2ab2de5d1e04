"""`mlx-medic node facts [MODEL]`: what a playbook reads about this node for its preflight
and an escalation (mlx_medic.node.facts): memory, RDMA (null without it), the MLX and
mlx-lm versions, the OS build and, with MODEL, the last matching lines of its service
logs with the signature each matches and the byte offset it starts at, each log's size
(`log_sizes`), and the serve wrapper's record of it (`serve`: state, backend, the last
failed start's failure; null where none is kept), and this boot's id with the survivors of
SIGKILL the ledger records here (`boot`). Exit 0 with whatever could be read;
each part that could not is null with its reason beside it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mlx_medic.node.cli import EXIT_OK, add_node_arguments, emit, node_context
from mlx_medic.node.model_arg import placed_model

DEFAULT_LINES = 20


def _count(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 1000:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count of lines from 0 to 1000")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        default=None,
        help="a model placed on this node: its service logs too",
    )
    parser.add_argument(
        "--lines",
        type=_count,
        default=DEFAULT_LINES,
        help=f"matching log lines to report ({DEFAULT_LINES})",
    )
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node.facts import (
        boot_facts,
        drain_facts,
        memory_facts,
        os_build,
        rdma_facts,
        recent_errors,
        serve_facts,
        versions,
    )
    from mlx_medic.platform.commands import run_command
    from mlx_medic.signatures import signatures_for

    context = node_context(args)
    model = placed_model(context, args.model) if args.model is not None else None
    document: dict[str, Any] = {
        "node": context.node,
        "model": model.name if model else None,
        "memory": memory_facts(run_command, sys.platform),
        "rdma": rdma_facts(run_command),
        "versions": versions(),
        "os": os_build(run_command, sys.platform),
        "boot": boot_facts(context.state_dir, context.node),
        "drain": drain_facts(context.state_dir),
    }
    if model is not None:
        errors, unreadable, sizes = recent_errors(
            model.log_files, signatures_for(context.inventory), args.lines
        )
        document["log_errors"], document["unreadable_logs"] = errors, unreadable
        document["log_sizes"] = sizes
        document["serve"] = serve_facts(context.state_dir, model.name)
    lines = [
        f"node {context.node}: {document['memory']['available_bytes']} bytes available",
        f"  RDMA: {'none' if document['rdma'] is None else document['rdma']}",
        f"  mlx {document['versions']['mlx']}, mlx-lm {document['versions']['mlx-lm']},"
        f" {document['os']['build']}",
    ]
    lines += [
        f"  {e['file']}: [{e['signature']}] {e['line']}" for e in document.get("log_errors", [])
    ]
    emit("facts", document, args.json, "\n".join(lines))
    return EXIT_OK
