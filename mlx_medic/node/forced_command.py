"""`mlx-medic node forced-command --inventory INVENTORY [--key remediator|serve]
[--node NAME]`: the `command=` of a key in a node's `authorized_keys`, so that key can run
only what its own user's code sends (mlx_medic.node.key_table, one table per key).

sshd runs it for every login with that key and puts what the client asked for in
`SSH_ORIGINAL_COMMAND`. That line is split with shlex (no shell ever sees it) and must be
`mlx-medic node HELPER ...` (the inventory's `medic_command` counts as `mlx-medic`); the
health probe too is a helper (`node probe MODEL`: the inventory says where it probes).
A helper's words are parsed by that helper's own argparse parser (no abbreviations, no
--help), checked generically (MODEL must be an inventory model placed on this node,
`--inventory` this inventory, `--state-dir` its state dir, `--node` this node, and no
other path) and then against the key's table: one of its grants, exact
in options and values (the remediator's key cannot send the serve wrapper's start sweep,
`run set` or a lock with another holder; the serve key nothing but the wrapper's calls
to a peer). Then the helper runs in this same process (`mlx_medic.cli.main`).
Anything else is refused on stderr, exit 2, saying why. `mlx-medic render
authorized-keys` writes the lines, one per key:

    restrict,no-user-rc,from="10.0.0.5",command="/opt/mlx-medic/bin/mlx-medic node
    forced-command --inventory /etc/mlx-medic/inventory.yaml --key remediator"
    ssh-ed25519 AAAA... remediator

`--key` defaults to `remediator`: the lines written before there were two keys (no
`--key`) were the remediator's, so they keep working for the remediator and no longer
allow anything it does not send (a missing `--key` never grants the serve key's calls).

This node is `--node NAME`, else `<state_dir>/node-id` (as every helper finds it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mlx_medic.command_line import add_inventory_flag
from mlx_medic.node.cli import HELPERS, BadArguments, helper_inventory
from mlx_medic.node.key_table import KEYS, Grant, KeyName, Refused, Request, grants, match

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

EXIT_REFUSED = 2
THIS_HELPER = "forced-command"
SESSION = "session"  # one login for many helpers, each checked here as its own
# Every caller's tail (mlx_medic.node.client.helper_argv), checked for every grant.
# `--config.file` is `--inventory`'s deprecated spelling, which callers before it sent.
GENERIC_OPTIONS = (
    "--inventory",
    "--config.file",
    "--state-dir",
    "--node",
    "--json",
    "--time-limit",
)

__all__ = [
    "EXIT_REFUSED",
    "Allowed",
    "Refused",
    "add_arguments",
    "checked",
    "helper_names",
    "run",
    "validate",
]


class _Checking(argparse.ArgumentParser):
    """A helper's parser that refuses instead of exiting: no abbreviations, no --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(add_help=False, allow_abbrev=False, exit_on_error=False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise Refused(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise Refused(message or f"{self.prog} would exit")


def helper_names(key: KeyName = "remediator") -> list[str]:
    """The node helpers `key` may run (never this one)."""
    return sorted({g.helper for g in grants(key)} - {THIS_HELPER})


def helper_parser(helper: str) -> argparse.ArgumentParser:
    parser = _Checking(prog=f"mlx-medic node {helper}")
    importlib.import_module(HELPERS[helper][0]).add_arguments(parser)
    return parser


def option_dests(parser: argparse.ArgumentParser) -> dict[str, str]:
    """--option -> its dest, in the parser and its subcommands' parsers."""
    dests: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                dests |= option_dests(sub)
        dests |= {option: action.dest for option in action.option_strings}
    return dests


@dataclass(frozen=True)
class Allowed:
    """What the request may mean: this inventory, this node, this key's table."""

    inventory: Inventory
    inventory_file: Path
    this_node: str | None  # None: unknown, and `unknown_node` says why (helpers refused)
    unknown_node: str = ""
    key: KeyName = "remediator"

    def _same_path(self, option: str, expected: Path) -> Callable[[str], str]:
        def check(value: str) -> str:
            if os.path.normpath(value) != os.path.normpath(expected):
                raise Refused(f"{option} {value!r} is not the inventory's ({expected})")
            return str(expected)

        return check

    def request(self, model: str | None = None) -> Request:
        return Request(
            self.inventory,
            self.this_node or "",
            self.inventory.model(model) if model is not None else None,
        )

    def programs(self) -> set[str]:
        return {"mlx-medic"} | {node.medic_command for node in self.inventory.nodes}

    def check_helper(self, helper: str, parsed: argparse.Namespace) -> None:
        """The generic checks on a helper's parsed arguments."""
        if self.this_node is None:
            raise Refused(f"this node's name is unknown ({self.unknown_node})")
        values = dict(vars(parsed))
        given = values.pop("inventory", None)
        if given is not None:
            self._same_path("--inventory", self.inventory_file)(str(given))
        state_dir = values.pop("state_dir", None)
        if state_dir is not None:
            self._same_path("--state-dir", self.inventory.state_dir)(str(state_dir))
        node = values.pop("node", None)
        if node is not None and node != self.this_node:
            raise Refused(f"--node {node!r} is not this node ({self.this_node})")
        model = values.pop("model", None)
        if model is not None:
            placed = [m.name for m in self.inventory.models_on(self.this_node)]
            if model not in placed:
                raise Refused(
                    f"model {model!r} is not an inventory model placed on"
                    f" {self.this_node} (models here: {', '.join(placed)})"
                )
        for name, value in values.items():
            if isinstance(value, Path):
                raise Refused(f"{helper}: a path ({name} {str(value)!r}) is not allowed here")


def _once_each(words: list[str], command: str) -> None:
    seen: set[str] = set()
    for word in words:
        if word.startswith("--"):
            name = word.partition("=")[0]
            if name in seen:
                raise Refused(f"option {name!r} given twice to {command!r}")
            seen.add(name)


def _validate_helper(helper: str, words: list[str], allowed: Allowed) -> tuple[list[str], Grant]:
    command = f"node {helper}"
    names = helper_names(allowed.key)
    if helper not in names:
        raise Refused(
            f"{command!r} is not allowed for the {allowed.key} key (helpers: {', '.join(names)})"
        )
    _once_each(words, command)
    parser = helper_parser(helper)
    try:
        parsed = parser.parse_args(words)
    except argparse.ArgumentError as exc:
        raise Refused(f"{command}: {exc}") from None
    except Refused as exc:
        raise Refused(f"{command}: {exc}") from None
    allowed.check_helper(helper, parsed)
    dests = option_dests(parser)
    given = {
        name: getattr(parsed, dests[name])
        for name in (w.partition("=")[0] for w in words if w.startswith("--"))
        if name not in GENERIC_OPTIONS
    }
    values = vars(parsed)
    try:
        grant = match(
            allowed.key,
            helper,
            values.get("action"),
            given,
            values,
            allowed.request(values.get("model")),
        )
    except Refused as exc:
        raise Refused(f"{command}: {exc}") from None
    argv = ["node", helper, *words]
    if getattr(parsed, "inventory", None) is None:
        argv += ["--inventory", str(allowed.inventory_file)]  # the inventory this key runs with
    return argv, grant


def validate(original: str | None, allowed: Allowed) -> list[str]:
    """The mlx-medic arguments to run for `original` (SSH_ORIGINAL_COMMAND), or Refused."""
    return checked(original, allowed)[0]


def checked(original: str | None, allowed: Allowed) -> tuple[list[str], Grant]:
    """`validate`'s arguments and the key's grant they are (Refused when none)."""
    if not original or not original.strip():
        raise Refused("no command given: this key runs only mlx-medic node helpers")
    try:
        words = shlex.split(original)
    except ValueError as exc:
        raise Refused(f"cannot split the command: {exc}") from None
    program, *args = words
    if program not in allowed.programs():
        raise Refused(f"{program!r} is not mlx-medic: this key runs only mlx-medic")
    if not args:
        raise Refused("no mlx-medic subcommand given")
    if args[0] != "node":
        raise Refused(f"{args[0]!r} is not allowed (allowed: node HELPER)")
    if len(args) < 2 or args[1].startswith("-"):
        raise Refused("no node helper given")
    return _validate_helper(args[1], args[2:], allowed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inventory_flag(parser, "the inventory the allowed commands are checked against (required)")
    parser.add_argument(
        "--key",
        choices=KEYS,
        default="remediator",
        help="whose key this is: the commands it may send"
        " (mlx_medic.node.key_table; default %(default)s)",
    )
    parser.add_argument(
        "--node", default=None, help="this node's name (default: <state_dir>/node-id)"
    )


def run(args: argparse.Namespace) -> int:
    if args.inventory is None:
        raise BadArguments("--inventory FILE is required: the inventory this key runs with")
    return run_original(os.environ.get("SSH_ORIGINAL_COMMAND"), args, session=True)


def run_original(original: str | None, args: argparse.Namespace, *, session: bool) -> int:
    """Check `original` against this key and run it here; a helper session's requests come
    back through this, each checked as a login of its own (`session=False`: no session
    inside one)."""
    from mlx_medic.state.node_identity import NodeIdentityError, resolve_node

    inventory_file = Path(os.path.abspath(args.inventory))
    inventory = helper_inventory(inventory_file)
    this_node, unknown = None, ""
    try:
        this_node = resolve_node(inventory, args.node, inventory.state_dir)
    except NodeIdentityError as exc:
        unknown = str(exc)
    allowed = Allowed(inventory, inventory_file, this_node, unknown, args.key)
    try:
        argv, grant = checked(original, allowed)
        if grant.helper == SESSION and not session:
            raise Refused("a helper session runs helpers, not another session")
    except Refused as exc:
        print(f"mlx-medic forced command: refused {original!r}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if grant.helper == SESSION:
        from mlx_medic.node.session_cli import serve

        return serve(lambda words: run_original(shlex.join(words), args, session=False))
    # In this process: the helper's code is what this forced command already runs (its
    # interpreter and import path, which the rendered command= fixes), so a second Python
    # would isolate nothing and only double the start-up every remediation step pays.
    from mlx_medic.cli import main

    return main(argv)
