"""`mlx-medic doctor [--inventory FILE] [--node NAME] [--json]`: check this node against
what the project assumes and print a report to paste into an issue (docs/doctor.md).
`mlx-medic doctor --config.file FILE [--json]`: from the remediator's host, check every
node of its inventory as the remediator reaches it (mlx_medic.remediator.cluster_doctor,
imported by name: shared code imports no deployable).

Read-only: it runs only the commands and sends only the helper calls in
mlx_medic/doctor/commands.py. Exit 0: nothing failed; 1: a check failed (each failure
says what to fix); 2: it could not start as asked (a bad flag, a config or inventory it
cannot read, a node the inventory does not name).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic.command_line import CommandError, file_error

if TYPE_CHECKING:
    from mlx_medic.doctor.report import Report

CLUSTER_DOCTOR = "mlx_medic.remediator.cluster_doctor"
TWO_VIEWS = (
    "--config.file (every node, from the remediator's host) and --inventory (this node)"
    " are two views: give one"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "check this node (or, with --config.file, every node as the remediator reaches"
        " it) against what mlx-medic assumes, read-only, and print a report to paste into"
        " an issue (docs/doctor.md)"
    )
    parser.epilog = (
        "exit status: 0 nothing failed; 1 a check failed; 2 a bad flag, a config or"
        " inventory that cannot be read, or a node the inventory does not name"
    )
    parser.add_argument(
        "--inventory",
        type=Path,
        default=None,
        metavar="FILE",
        help="the inventory: check this node's setup against it (without it, only the"
        " machine's own facts are checked)",
    )
    parser.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the remediator's config: on every node of its inventory, over SSH as the"
        " remediator logs in, run the read-only form of every helper call its playbooks"
        " make (not with --inventory or --node)",
    )
    parser.add_argument(
        "--node",
        default=None,
        metavar="NAME",
        help="this node's name in the inventory (default: <state_dir>/node-id)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")


def run(args: argparse.Namespace) -> int:
    if args.config_file is not None:
        if args.inventory is not None:
            raise CommandError(TWO_VIEWS)
        if args.node is not None:
            raise CommandError("--node names this node: --config.file checks every node")
        report = cluster_report(args.config_file)
    else:
        report = node_report(args)
    if args.json:
        print(json.dumps(report.document(), indent=2))
    else:
        print(report.text())
    return report.exit_code


def cluster_report(config_file: Path) -> Report:
    report: Report = importlib.import_module(CLUSTER_DOCTOR).cluster_report(config_file)
    return report


def node_report(args: argparse.Namespace) -> Report:
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
    return build_report(context, source)
