"""`mlx-medic doctor [--inventory FILE] [--node NAME] [--json]`: check this node against
what the project assumes and print a report to paste into an issue (docs/doctor.md).

Read-only: it runs only the commands in mlx_medic/doctor/commands.py. Exit 0: nothing
failed; 1: a check failed (each failure says what to fix); 2: it could not start as asked
(a bad flag, an inventory it cannot read, a node the inventory does not name).
"""

from __future__ import annotations

import argparse
import json
import sys

from mlx_medic.command_line import CommandError, add_inventory_flag, file_error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "check this node against what mlx-medic assumes, read-only, and print a report to"
        " paste into an issue (docs/doctor.md)"
    )
    parser.epilog = (
        "exit status: 0 nothing failed; 1 a check failed; 2 a bad flag, an inventory that"
        " cannot be read, or a node the inventory does not name"
    )
    add_inventory_flag(
        parser,
        "the inventory: check this node's setup against it (without it, only the machine's"
        " own facts are checked)",
    )
    parser.add_argument(
        "--node",
        default=None,
        metavar="NAME",
        help="this node's name in the inventory (default: <state_dir>/node-id)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")


def run(args: argparse.Namespace) -> int:
    from mlx_medic.doctor.framework import DoctorContext, current_user
    from mlx_medic.doctor.report import build_report

    inventory, node, source = None, None, ""
    if args.inventory is not None:
        from mlx_medic.inventory.load import load_inventory
        from mlx_medic.inventory.methods import InventoryError
        from mlx_medic.state.node_identity import NodeIdentityError, node_id_path, resolve_node

        try:
            inventory = load_inventory(args.inventory)
            name = resolve_node(inventory, args.node, inventory.state_dir)
        except InventoryError as exc:
            raise file_error(exc) from None
        except NodeIdentityError as exc:
            raise CommandError(str(exc)) from None
        assert name is not None  # resolve_node names a node or raises, given an inventory
        node = inventory.node(name)
        source = "--node" if args.node else str(node_id_path(inventory.state_dir))
    elif args.node is not None:
        raise CommandError("--node names a node of the inventory: give --inventory FILE too")
    context = DoctorContext(sys.platform, current_user(), inventory, args.inventory, node)
    report = build_report(context, source)
    if args.json:
        print(json.dumps(report.document(), indent=2))
    else:
        print(report.text())
    return report.exit_code
