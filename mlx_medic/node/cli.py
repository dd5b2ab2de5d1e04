"""`mlx-medic node HELPER ...`: the helpers that run on a node, one module each.

Only the chosen helper's module is imported (like the top-level COMMANDS table): the
remediator runs a helper over SSH on every step of every run. Every helper prints, with
`--json`, one JSON document on stdout that starts with the schema version, the mlx-medic
version that wrote it and the helper's name (`helper_document`: a caller refuses another
schema or version, mlx_medic.node.misconfiguration); its exit status is 0 for success, 1
when it could not do its job (the reason on stderr), 2 when it could not start as asked
(docs/exit-codes.md). With `--time-limit SECONDS` (every caller sends its own wait), a
helper still running past it ends itself and what it started (`end_at_time_limit`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from mlx_medic.command_line import (
    EXIT_FAILED,
    EXIT_USAGE,
    CommandParser,
    add_inventory_flag,
    version,
)
from mlx_medic.command_line import EXIT_OK as EXIT_OK  # the helpers' status, named here
from mlx_medic.state.layout import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

SCHEMA = 1
EXIT_BAD_ARGUMENTS = EXIT_USAGE

# helper name -> (module with add_arguments(parser) and run(args) -> int, help)
HELPERS: dict[str, tuple[str, str]] = {
    "ledger": ("mlx_medic.node.ledger_cli", "this node's protection-domain ledger and reserves"),
    "sweep": ("mlx_medic.node.sweep_cli", "end the model's processes on this node, safely"),
    "clean": (
        "mlx_medic.node.clean_cli",
        "remove the model's stale tmp entries and mlx.launch leftovers",
    ),
    "orphans": ("mlx_medic.node.orphans_cli", "this node's orphan report (suspects apart)"),
    "service": (
        "mlx_medic.node.service_cli",
        "stop, start, restart the model's service on its head; the stop record",
    ),
    "run": ("mlx_medic.node.run_cli", "the model's current run on this node and its lease"),
    "backend": ("mlx_medic.node.backend_cli", "the model's backend choice on its head"),
    "lock": ("mlx_medic.node.lock_cli", "the model lock's file on its head, compare-then-write"),
    "pid-alive": ("mlx_medic.node.pid_alive_cli", "whether a pid, started at a time, lives here"),
    "facts": (
        "mlx_medic.node.facts_cli",
        "memory, RDMA, versions, OS build and a model's recent log errors here",
    ),
    "room": (
        "mlx_medic.node.room_cli",
        "memory, staging space and the weights held here, before a model's start",
    ),
    "probe": (
        "mlx_medic.node.probe_cli",
        "the model's health probe on its head, under the node's probe locks",
    ),
    "drain": (
        "mlx_medic.node.drain_cli",
        "the record on this node that it is drained (mlx-medic drain / undrain)",
    ),
    "reboot": (
        "mlx_medic.node.reboot_cli",
        "run this node's reboot command through sudo -n, if its reboot.allowed",
    ),
    "session": (
        "mlx_medic.node.session_cli",
        "run many helpers in one login, each in a child forked for it",
    ),
    "forced-command": (
        "mlx_medic.node.forced_command",
        "an authorized_keys command=: run SSH_ORIGINAL_COMMAND if its key may send it",
    ),
}


class HelperError(Exception):
    """The helper cannot do its job; the message says why (printed on stderr, exit 1)."""


class BadArguments(HelperError):
    """The command line names something the helper may not act on (exit 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.epilog = "helpers:\n" + "\n".join(f"  {n:<16}{h}" for n, (_, h) in HELPERS.items())
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("helper", choices=sorted(HELPERS), metavar="HELPER")
    parser.add_argument("helper_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every helper shares: where the inventory is and which node this is."""
    add_inventory_flag(parser, "the inventory YAML (its state_dir, models and nodes)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"override the inventory's state_dir (default {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--node",
        default=None,
        help="this node's name in the inventory (default: <state dir>/node-id)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--time-limit",
        type=time_limit,
        default=None,
        metavar="SECONDS",
        help="the caller's wait: past it, end this helper and every process it started"
        " (SIGKILL to its process group); default: no limit",
    )


def time_limit(text: str) -> float:
    """--time-limit's value: a positive number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


def end_at_time_limit(seconds: float, helper: str) -> None:
    """Past `seconds`, SIGKILL this helper's process group (itself and what it started).

    Why: a caller that stops waiting (asyncssh's timeout) does not end the command on the
    node, and sshd signals no command without a terminal, so a hung helper would go on
    acting unseen after its run moved on. Its own process group, so the kill reaches its
    children and nothing else: sshd already made it a session leader; run otherwise (a
    local call, by hand) it first makes a group of its own. The interval timer counts
    elapsed time, not the wall clock: a clock jump neither shortens nor stretches it."""
    if os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)

    def expire(_signum: int, _frame: object) -> None:
        said = f"mlx-medic node {helper}: its time limit ({seconds:g}s) passed: ending it\n"
        with contextlib.suppress(OSError):
            os.write(2, said.encode())
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)


class NodeContext(NamedTuple):  # not a dataclass: one fewer for every helper's start
    inventory: Inventory | None
    state_dir: Path
    node: str


def node_context(args: argparse.Namespace) -> NodeContext:
    """The inventory, state dir and this node's name, or HelperError saying what is missing."""
    from mlx_medic.state.node_identity import NodeIdentityError, resolve_node

    inventory = None
    if args.inventory is not None:
        inventory = helper_inventory(args.inventory)
    state_dir = args.state_dir or (inventory.state_dir if inventory else DEFAULT_STATE_DIR)
    try:
        node = resolve_node(inventory, args.node, state_dir)
    except NodeIdentityError as exc:  # no name, or a name the inventory lacks: as asked
        raise BadArguments(str(exc)) from None
    if node is None:
        raise BadArguments(
            "which node is this? pass --node NAME, --inventory with <state_dir>/node-id,"
            " or write the name to <state_dir>/node-id"
        )
    return NodeContext(inventory, state_dir, node)


def helper_inventory(path: Path) -> Inventory:
    """The inventory as a helper loads it: from its validated snapshot when there is one
    (no pydantic: mlx_medic.inventory.snapshot), else validated in full; BadArguments
    (exit 2, as for every command) with every problem when it is missing or not valid."""
    # No pydantic plugins in a helper that validates: looking for them reads every
    # installed package's metadata, which costs more than the validation.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.inventory.snapshot import load_cached_inventory

    try:
        return load_cached_inventory(path)
    except InventoryError as exc:
        raise BadArguments(exc.said()) from None


def helper_document(command: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A helper's JSON document: its schema, the mlx-medic version that wrote it (a
    constant of the package: no start-up cost), the helper's name, then its fields."""
    return {"schema": SCHEMA, "version": version(), "command": command, **fields}


def emit(command: str, document: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        json.dump(helper_document(command, document), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(text)


def run(args: argparse.Namespace) -> int:
    module_name, help_text = HELPERS[args.helper]
    module = importlib.import_module(module_name)
    parser = CommandParser(prog=f"mlx-medic node {args.helper}", description=help_text)
    module.add_arguments(parser)
    helper_args = parser.parse_args(args.helper_args)
    limit = getattr(helper_args, "time_limit", None)
    if limit is not None:
        end_at_time_limit(limit, args.helper)
    try:
        return int(module.run(helper_args))
    except BadArguments as exc:
        print(f"mlx-medic node {args.helper}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except HelperError as exc:
        print(f"mlx-medic node {args.helper}: {exc}", file=sys.stderr)
        return EXIT_FAILED
