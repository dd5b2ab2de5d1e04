"""tmpfiles.d (Linux): a node's state dir, made for its login user before any unit starts.

Why tmpfiles.d and not the exporter's `StateDirectory=`: that would make systemd re-own
the dir to the unit's user (root) at every start, and the node's login user could no
longer write its locks there. And why not `ReadWritePaths=` of the parent: the root
exporter (ProtectSystem=strict) would then write anywhere in /var/lib. systemd-tmpfiles
runs at boot before every service (and by hand at install), makes the dir with the
layout's owner and mode (mlx_medic/state/layout.py), and gives back a dir that another
unit or an older version re-owned; the exporter then corrects what is inside it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.render.files import GENERATED, Rendered, RenderError
from mlx_medic.state.layout import DIR_MODE, DIRS, STATE_GROUP

CONF_NAME = "mlx-medic.conf"  # as installed: /etc/tmpfiles.d/mlx-medic.conf


def _path(path: PurePosixPath) -> str:
    """A tmpfiles.d path: absolute, one word, `%` doubled (a specifier otherwise)."""
    text = str(path)
    if not path.is_absolute() or any(c.isspace() for c in text) or not text.isprintable():
        raise RenderError(f"state_dir: {text!r}: tmpfiles.d needs an absolute path without spaces")
    return text.replace("%", "%%")


def conf(inventory: Inventory, node: Node) -> str:
    """The node's tmpfiles.d file: its state dir and the dirs in it, `d` lines."""
    state_dir = PurePosixPath(inventory.state_dir)
    lines = [
        f"d {_path(state_dir / part if part else state_dir)} {DIR_MODE:04o} {node.user}"
        f" {STATE_GROUP} -"
        for part in ("", *DIRS)
    ]
    comment = (
        f"{GENERATED}\n"
        f"The state dir of node {node.name} (the inventory's state_dir), owned by its login\n"
        f"user (nodes.{node.name}.user) with group {STATE_GROUP} (docs/state-layout.md).\n"
        f"Create the group first (groupadd --system {STATE_GROUP}; add the login user and,\n"
        "on the remediator's host, the remediator's user to it), install this file as\n"
        f"/etc/tmpfiles.d/{CONF_NAME}, then\n"
        f"  systemd-tmpfiles --create /etc/tmpfiles.d/{CONF_NAME}\n"
        "At every boot systemd applies it before the exporter starts, giving back a dir\n"
        "that was re-owned; the exporter (root) corrects what is inside."
    )
    return "".join(f"# {line}\n" for line in comment.splitlines()) + "\n".join(lines) + "\n"


def rendered(inventory: Inventory, node: Node, target: str) -> Rendered:
    return Rendered(
        PurePosixPath(target) / node.name / "tmpfiles.d" / CONF_NAME, conf(inventory, node)
    )
