"""Which inventory node this process runs on: said, never guessed.

Why never guessed: on the testbed every node is 127.0.0.N on one machine with one host
name, and a real cluster's DNS or a second interface can make a guess wrong. A wrong
"this is ai001" would probe, lock or sweep the wrong machine. So a node's identity is
explicit: `--node NAME`, or the node id file `<state_dir>/node-id` that a deployment
writes once per node (`mlx-medic` commands run over SSH read it there).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.schema import Inventory

NODE_ID_FILE = "node-id"


class NodeIdentityError(LookupError):
    pass


def node_id_path(state_dir: Path) -> Path:
    return Path(state_dir) / NODE_ID_FILE


def read_node_id(state_dir: Path) -> str | None:
    """The name in `<state_dir>/node-id`, or None when there is no such file."""
    from mlx_medic.state.files import StateFileError, read_text_nofollow

    try:  # never through a link, a FIFO or a device: the state dir is the node user's
        text = read_text_nofollow(node_id_path(state_dir))
    except StateFileError as exc:
        raise NodeIdentityError(str(exc)) from exc
    if text is None:
        return None
    name = text.strip()
    if not name or len(text.strip().splitlines()) != 1:
        raise NodeIdentityError(f"{node_id_path(state_dir)} must hold one node name")
    return name


def write_node_id(state_dir: Path, name: str) -> Path:
    """Record this node's name (atomically: a half-written id is never read), with the
    state dir's owner and modes (mlx_medic/state/layout.py)."""
    from mlx_medic.state.files import write_text_atomic

    return write_text_atomic(node_id_path(state_dir), name + "\n")


def resolve_node(
    inventory: Inventory | None, requested: str | None, state_dir: Path | None
) -> str | None:
    """This node's inventory name: `requested`, else the node id file.

    None only without an inventory and without either (discovery mode: nothing is
    named after a node). With an inventory, a name it does not list, or no name at
    all, is an error that says how to name the node.
    """
    source = f"--node {requested!r}"
    name = requested
    if not name and state_dir is not None:
        name = read_node_id(state_dir)
        source = f"{node_id_path(state_dir)} names {name!r}, which"
    if inventory is None:
        return name or None
    known = [node.name for node in inventory.nodes]
    if not name:
        where = f" or write it to {node_id_path(state_dir)}" if state_dir is not None else ""
        raise NodeIdentityError(
            f"which inventory node is this? pass --node NAME{where} (nodes: {', '.join(known)})"
        )
    if name not in known:
        raise NodeIdentityError(f"{source} is not in the inventory (nodes: {', '.join(known)})")
    return name
