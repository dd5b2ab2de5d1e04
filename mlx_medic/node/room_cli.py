"""`mlx-medic node room MODEL`: the room this node has for the model before a start
(mlx_medic.node.room): available memory (and macOS's GPU wired limit), the free bytes
where the weights would be staged, and the weights it holds (names and sizes; with
`--sha256` each file's SHA-256 too, which reads them in full). Exit 0
with what could be read; 1 when it could not be read at all."""

from __future__ import annotations

import argparse
import sys

from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.node.model_arg import placed_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a model placed on this node")
    parser.add_argument(
        "--sha256",
        action="store_true",
        help="also each weights file's SHA-256 (reads every byte: serve.preseed.compare)",
    )
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node.room import room
    from mlx_medic.platform.commands import run_command

    context = node_context(args)
    model = placed_model(context, args.model)
    try:
        found = room(
            context.state_dir, model.weights_path(), run_command, sys.platform, args.sha256
        )
    except (OSError, ValueError) as exc:
        raise HelperError(f"cannot read this node's room for {model.name}: {exc}") from None
    document = {"node": context.node, "model": model.name, **found}
    weights = found["weights"]
    text = f"node {context.node}: {found['memory']['available_bytes']} bytes of memory available"
    if weights is not None:
        held = "none" if weights["files"] is None else f"{weights['bytes']} bytes"
        text += f"; weights at {weights['path']}: {held}"
        text += f"; {found['staging']['free_bytes']} bytes free in {found['staging']['dir']}"
    emit("room", document, args.json, text)
    return EXIT_OK
