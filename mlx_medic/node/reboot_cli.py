"""`mlx-medic node reboot [--dry-run]`: run this node's reboot command, as the inventory
names it (`nodes.<name>.reboot.command`), through `sudo -n`: the one command the rendered
sudoers rule lets the login user run (`mlx-medic render sudoers`). The remediator's
`reboot-node` run sends it once every guard of its guarded reboot holds (docs/drain.md).

Only when the node's `reboot.allowed` is true (else exit 2, nothing run). The command is an
argument list, never a shell: `sudo -n COMMAND...`, exactly the inventory's words. The
login user `root` runs the command itself (root needs no sudoers rule; the testbed's
default mode logs in as root). `--dry-run` only says the argv.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Sequence
from typing import Any

from mlx_medic.command_line import EXIT_FAILED
from mlx_medic.node.cli import EXIT_OK, BadArguments, add_node_arguments, emit, node_context

SAID = 500  # the command's stderr kept in the reply


def reboot_argv(command: Sequence[str], *, as_root: bool) -> list[str]:
    """What runs: the inventory's reboot command, through `sudo -n` unless already root."""
    return [*command] if as_root else ["sudo", "-n", *command]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only say the command")
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    if context.inventory is None:
        raise BadArguments("--inventory FILE is required: it names the reboot command")
    node = context.inventory.node(context.node)
    if not node.reboot.allowed:
        raise BadArguments(
            f"nodes.{node.name}.reboot.allowed is false: mlx-medic does not reboot this node"
        )
    argv = reboot_argv(node.reboot.command, as_root=os.geteuid() == 0)
    document: dict[str, Any] = {
        "node": node.name,
        "argv": argv,
        "exit_status": None,
        "stderr": "",
    }
    if args.dry_run:
        emit("reboot", document, args.json, f"would run: {' '.join(argv)}")
        return EXIT_OK
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        document |= {"stderr": str(exc)}
        emit("reboot", document, args.json, f"{' '.join(argv)}: {exc}")
        return EXIT_FAILED
    said = done.stderr.strip()[-SAID:]
    document |= {"exit_status": done.returncode, "stderr": said}
    emit("reboot", document, args.json, f"{' '.join(argv)}: exit {done.returncode} {said}")
    return EXIT_OK if done.returncode == 0 else EXIT_FAILED
