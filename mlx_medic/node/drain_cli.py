"""`mlx-medic node drain set --by WHO [--models M,M] | clear | show`: the record on this
node that it is drained (mlx_medic/state/node_drain.py), which `mlx-medic drain NODE`
writes once the node's models are stopped and `mlx-medic undrain NODE` removes; `node
facts` shows it (`drain`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.state.files import StateFileError
from mlx_medic.state.node_drain import clear_node_drain, read_node_drain, record_node_drain


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_ = actions.add_parser("set", help="record that this node is drained")
    set_.add_argument("--by", required=True, help="who drains it, for the record")
    set_.add_argument("--models", default="", help="the models stopped, comma-separated")
    clear = actions.add_parser("clear", help="remove the record (the undrain)")
    show = actions.add_parser("show", help="the record, if any")
    for sub in (set_, clear, show):
        add_node_arguments(sub)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    try:
        if args.action == "set":
            models = tuple(m for m in args.models.split(",") if m)
            record = record_node_drain(context.state_dir, args.by, models)
            said = f"{context.node} drained by {record.by}"
        elif args.action == "clear":
            removed = clear_node_drain(context.state_dir)
            record = None
            said = f"{context.node}: drain record {'removed' if removed else 'was not there'}"
        else:
            record = read_node_drain(context.state_dir)
            said = f"{context.node}: {'drained by ' + record.by if record else 'not drained'}"
    except (StateFileError, ValueError) as exc:
        raise HelperError(str(exc)) from None
    document = {"action": args.action, "drain": asdict(record) if record else None}
    emit("drain", document, args.json, said)
    return EXIT_OK
