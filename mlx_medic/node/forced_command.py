"""`mlx-medic node forced-command --config.file INVENTORY [--node NAME]`: the `command=` of
the remediator's key in a node's `authorized_keys`, so that key can run only the node
helpers and the probe.

sshd runs it for every login with that key and puts what the client asked for in
`SSH_ORIGINAL_COMMAND`. That line is split with shlex (no shell ever sees it) and must be
`mlx-medic node HELPER ...` (any helper in HELPERS but this one) or `mlx-medic probe ...`
(the inventory's `medic_command` counts as `mlx-medic`). A helper's words are parsed by
that helper's own argparse parser (no abbreviations, no --help) and then checked
generically: MODEL must be an inventory model placed on this node, `--config.file` this
inventory, `--state-dir` its state dir, `--node` this node, and no other path; some flags
are never allowed through this key (REFUSED_FLAGS: sweep's `--start-sweep`, which only the
serve wrapper may use, locally). Then the words are executed directly with this
interpreter's mlx-medic. Anything else is refused on stderr, exit 2. The
`authorized_keys` line, one line (`restrict` also forbids a pty and forwarding):

    command="/opt/mlx-medic/bin/mlx-medic node forced-command
    --config.file /etc/mlx-medic/inventory.yaml",restrict ssh-ed25519 AAAA... remediator

This node is `--node NAME`, else `<state_dir>/node-id` (as every helper finds it).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mlx_medic.node.cli import HELPERS, helper_inventory

if TYPE_CHECKING:
    from mlx_medic.inventory import Inventory

EXIT_REFUSED = 2
MAX_PROBE_TIMEOUT = 600.0
THIS_HELPER = "forced-command"

# helper -> flag -> why this key may never pass it
REFUSED_FLAGS: dict[str, dict[str, str]] = {
    "sweep": {"--start-sweep": "only the serve wrapper's own start sweep, run locally, may"
                               " touch a process serving the model's port"},
}


class Refused(ValueError):
    """The requested command is not one this key may run; the message says why."""


class _Checking(argparse.ArgumentParser):
    """A helper's parser that refuses instead of exiting: no abbreviations, no --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(add_help=False, allow_abbrev=False, exit_on_error=False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise Refused(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise Refused(message or f"{self.prog} would exit")


def helper_names() -> list[str]:
    """Every helper this key may run: HELPERS, but this one."""
    return sorted(set(HELPERS) - {THIS_HELPER})


def helper_parser(helper: str) -> argparse.ArgumentParser:
    parser = _Checking(prog=f"mlx-medic node {helper}")
    importlib.import_module(HELPERS[helper][0]).add_arguments(parser)
    return parser


@dataclass(frozen=True)
class Allowed:
    """What the request may mean: this inventory, this node, the probe's targets."""

    inventory: Inventory
    config_file: Path
    this_node: str | None  # None: unknown, and `unknown_node` says why (helpers refused)
    unknown_node: str = ""

    def _same_path(self, option: str, expected: Path) -> Callable[[str], str]:
        def check(value: str) -> str:
            if os.path.normpath(value) != os.path.normpath(expected):
                raise Refused(f"{option} {value!r} is not the inventory's ({expected})")
            return str(expected)

        return check

    def probe_options(self) -> dict[str, Callable[[str], str]]:
        state_dir = self.inventory.state_dir
        return {"--host": _host, "--port": _port, "--timeout": _timeout,
                "--lock-dir": self._same_path("--lock-dir", state_dir / "locks")}  # fmt: skip

    def programs(self) -> set[str]:
        return {"mlx-medic"} | {node.medic_command for node in self.inventory.nodes}

    def check_probe_target(self, options: dict[str, str]) -> None:
        for required in ("--host", "--port"):
            if required not in options:
                raise Refused(f"probe needs {required}")
        from mlx_medic.health import probe_host

        host, port = options["--host"], int(options["--port"])
        for model in self.inventory.models:
            hosts = {model.host, probe_host(model.host)}
            if model.port == port and host in hosts:
                return
        raise Refused(f"no model in the inventory listens on {host} port {port}")

    def check_helper(self, helper: str, parsed: argparse.Namespace) -> None:
        """The generic checks on a helper's parsed arguments."""
        if self.this_node is None:
            raise Refused(f"this node's name is unknown ({self.unknown_node})")
        values = dict(vars(parsed))
        config = values.pop("config_file", None)
        if config is not None:
            self._same_path("--config.file", self.config_file)(str(config))
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
                raise Refused(f"model {model!r} is not an inventory model placed on"
                              f" {self.this_node} (models here: {', '.join(placed)})")  # fmt: skip
        for name, value in values.items():
            if isinstance(value, Path):
                raise Refused(f"{helper}: a path ({name} {str(value)!r}) is not allowed here")


def _host(value: str) -> str:
    return value  # checked with the port against the inventory's models


def _port(value: str) -> str:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise Refused(f"--port {value!r} is not a TCP port")
    return value


def _timeout(value: str) -> str:
    try:
        seconds = float(value)
    except ValueError:
        raise Refused(f"--timeout {value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_PROBE_TIMEOUT):
        raise Refused(f"--timeout {value!r} is not between 0 and {MAX_PROBE_TIMEOUT:g} seconds")
    return value


def _once_each(words: list[str], command: str) -> None:
    seen: set[str] = set()
    for word in words:
        if word.startswith("--"):
            name = word.partition("=")[0]
            if name in seen:
                raise Refused(f"option {name!r} given twice to {command!r}")
            seen.add(name)


def _parse_probe(words: list[str], allowed: dict[str, Callable[[str], str]]) -> dict[str, str]:
    """`--name value` or `--name=value`, each at most once; nothing positional."""
    found: dict[str, str] = {}
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if not word.startswith("--"):
            raise Refused(f"unexpected argument {word!r} to 'probe'")
        name, has_value, value = word.partition("=")
        if name not in allowed:
            raise Refused(f"option {name!r} is not allowed for 'probe'")
        if not has_value:
            if not rest:
                raise Refused(f"option {name!r} needs a value")
            value = rest.pop(0)
        found[name] = allowed[name](value)
    return found


def _validate_helper(helper: str, words: list[str], allowed: Allowed) -> list[str]:
    command = f"node {helper}"
    if helper not in helper_names():
        raise Refused(f"{command!r} is not allowed (helpers: {', '.join(helper_names())})")
    for flag, why in REFUSED_FLAGS.get(helper, {}).items():
        if any(word == flag or word.startswith(flag + "=") for word in words):
            raise Refused(f"{flag} is never allowed through this key: {why}")
    _once_each(words, command)
    try:
        parsed = helper_parser(helper).parse_args(words)
    except argparse.ArgumentError as exc:
        raise Refused(f"{command}: {exc}") from None
    except Refused as exc:
        raise Refused(f"{command}: {exc}") from None
    allowed.check_helper(helper, parsed)
    argv = ["node", helper, *words]
    if getattr(parsed, "config_file", None) is None:
        argv += ["--config.file", str(allowed.config_file)]  # the inventory this key runs with
    return argv


def validate(original: str | None, allowed: Allowed) -> list[str]:
    """The mlx-medic arguments to run for `original` (SSH_ORIGINAL_COMMAND), or Refused."""
    if not original or not original.strip():
        raise Refused("no command given: this key runs only mlx-medic node helpers and probe")
    try:
        words = shlex.split(original)
    except ValueError as exc:
        raise Refused(f"cannot split the command: {exc}") from None
    program, *args = words
    if program not in allowed.programs():
        raise Refused(f"{program!r} is not mlx-medic: this key runs only mlx-medic")
    if not args:
        raise Refused("no mlx-medic subcommand given")
    if args[0] == "node":
        if len(args) < 2 or args[1].startswith("-"):
            raise Refused("no node helper given")
        return _validate_helper(args[1], args[2:], allowed)
    if args[0] != "probe":
        raise Refused(f"{args[0]!r} is not allowed (allowed: node HELPER, probe)")
    _once_each(args[1:], "probe")
    options = _parse_probe(args[1:], allowed.probe_options())
    allowed.check_probe_target(options)
    return ["probe", *(word for name, value in options.items() for word in (name, value))]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config.file", dest="config_file", type=Path, required=True,
                        help="the inventory the allowed commands are checked against")  # fmt: skip
    parser.add_argument("--node", default=None,
                        help="this node's name (default: <state_dir>/node-id)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node_identity import NodeIdentityError, resolve_node

    config_file = Path(os.path.abspath(args.config_file))
    inventory = helper_inventory(config_file)
    this_node, unknown = None, ""
    try:
        this_node = resolve_node(inventory, args.node, inventory.state_dir)
    except NodeIdentityError as exc:
        unknown = str(exc)
    original = os.environ.get("SSH_ORIGINAL_COMMAND")
    try:
        argv = validate(original, Allowed(inventory, config_file, this_node, unknown))
    except Refused as exc:
        print(f"mlx-medic forced command: refused {original!r}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "mlx_medic.cli", *argv])
