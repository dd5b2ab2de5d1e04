"""`mlx-medic backend MODEL [auto|ring|jaccl]`: show, pin or unpin the model's backend.

The choice is kept on the model's head (`mlx-medic node backend` there), where the serve
wrapper reads it before each start; so this runs that helper on the head: here when this
machine is the head (its node identity, `--node` or `<state_dir>/node-id`, says so), over
SSH otherwise (the inventory's `ssh` settings, the head's `medic_command`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic import person
from mlx_medic.command_line import CommandError, add_inventory_flag, file_error, unknown_model
from mlx_medic.state.backend_choice import CHOICES

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory
    from mlx_medic.node.client import HelperReply
    from mlx_medic.node.replies import BackendReply

DEFAULT_INVENTORY = Path("/etc/mlx-medic/inventory.yaml")
TIMEOUT = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the model, as the inventory names it")
    parser.add_argument(
        "choice",
        nargs="?",
        choices=CHOICES,
        metavar="CHOICE",
        help="pin ring or jaccl, or auto (JACCL, then ring); none: show",
    )
    add_inventory_flag(parser, f"the inventory (default {DEFAULT_INVENTORY})", DEFAULT_INVENTORY)
    parser.add_argument(
        "--node",
        default=None,
        help="this machine's inventory node, if it is one (default: node-id)",
    )
    parser.add_argument(
        "--reason",
        default="set by hand with `mlx-medic backend`",
        help="why, for the record the serve wrapper and the journal show",
    )
    parser.add_argument("--json", action="store_true", help="print the helper's JSON document")


def who() -> str:
    """The person, as the journal names people (`user@host`, the sudo user under sudo)."""
    return f"{person.who()} at a terminal"


async def ask_head(
    inventory: Inventory, model: str, this_node: str | None, args: list[str]
) -> HelperReply[BackendReply]:
    from mlx_medic.node.client import NodeHelpers
    from mlx_medic.node.replies import BackendReply
    from mlx_medic.transport import LocalTransport, NodeTransport, RoutedTransport, SshTransport

    remote = SshTransport(inventory, helper_sessions=False)  # one call: no session to open
    transport: NodeTransport = (
        RoutedTransport(this_node, LocalTransport(), remote) if this_node else remote
    )
    try:
        helpers = NodeHelpers(transport, inventory, timeout=TIMEOUT)
        return await helpers.call(inventory.model(model).head, BackendReply, model, *args)
    finally:
        await transport.close()


def run(args: argparse.Namespace) -> int:
    from mlx_medic.inventory.load import load_inventory
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.node.backend_cli import describe
    from mlx_medic.node.client import HelperCallError
    from mlx_medic.state.node_identity import NodeIdentityError, read_node_id, resolve_node

    try:
        inventory = load_inventory(args.inventory)
        inventory.model(args.model)
    except InventoryError as exc:
        raise file_error(exc) from None
    except KeyError:
        raise unknown_model(
            args.model, (m.name for m in inventory.models), args.inventory
        ) from None
    try:
        said = args.node or read_node_id(inventory.state_dir)
        this_node = resolve_node(inventory, args.node, inventory.state_dir) if said else None
    except NodeIdentityError as exc:
        raise CommandError(str(exc)) from None
    helper_args = ["show"]
    if args.choice is not None:
        helper_args = ["set", args.choice, "--by", who(), "--reason", args.reason]
    try:
        reply = asyncio.run(ask_head(inventory, args.model, this_node, helper_args))
    except HelperCallError as exc:
        print(f"mlx-medic backend: {exc}", file=sys.stderr)
        return 1
    if reply.stderr.strip():
        print(reply.stderr.strip(), file=sys.stderr)
    if args.json:
        print(json.dumps(reply.document))
    elif reply.ok:
        print(describe(args.model, reply.answer.choice) + f" (on {reply.node})")
    return reply.exit_status
