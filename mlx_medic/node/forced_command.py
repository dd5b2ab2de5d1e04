"""`mlx-medic node forced-command --config.file INVENTORY`: the `command=` of the
remediator's key in a node's `authorized_keys`, so that key can run only the node helpers
and the probe.

sshd runs it for every login with that key and puts what the client asked for in
`SSH_ORIGINAL_COMMAND`. That line is split with shlex (no shell ever sees it), checked
word by word (a known program, a known subcommand, known options with values the
inventory allows: its nodes, its models' host and port, its own paths) and then executed
directly with this interpreter's mlx-medic. Anything else is refused on stderr, exit 2.
The `authorized_keys` line, one line (`restrict` also forbids a pty and forwarding):

    command="/opt/mlx-medic/bin/mlx-medic node forced-command
    --config.file /etc/mlx-medic/inventory.yaml",restrict ssh-ed25519 AAAA... remediator
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic.node.cli import HelperError

if TYPE_CHECKING:
    from mlx_medic.inventory import Inventory

EXIT_REFUSED = 2
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # listening everywhere: probe loopback
MAX_PROBE_TIMEOUT = 600.0


class Refused(ValueError):
    """The requested command is not one this key may run; the message says why."""


@dataclass(frozen=True)
class Allowed:
    """What the request may mean: for each subcommand, its options and their checks."""

    inventory: Inventory
    config_file: Path

    def node_name(self, value: str) -> str:
        known = [node.name for node in self.inventory.nodes]
        if value not in known:
            raise Refused(f"node {value!r} is not in the inventory (nodes: {', '.join(known)})")
        return value

    def _same_path(self, option: str, expected: Path) -> Callable[[str], str]:
        def check(value: str) -> str:
            if os.path.normpath(value) != os.path.normpath(expected):
                raise Refused(f"{option} {value!r} is not the inventory's ({expected})")
            return str(expected)

        return check

    def options(self, command: str) -> dict[str, Callable[[str], str] | None]:
        """Allowed options of `command` ("node HELPER" or "probe"); None: takes no value."""
        state_dir = self.inventory.state_dir
        node_options: dict[str, Callable[[str], str] | None] = {
            "--json": None,
            "--node": self.node_name,
            "--config.file": self._same_path("--config.file", self.config_file),
            "--state-dir": self._same_path("--state-dir", state_dir),
        }
        allowed: dict[str, dict[str, Callable[[str], str] | None]] = {
            "node ledger": node_options,
            "probe": {
                "--host": _host,
                "--port": _port,
                "--timeout": _timeout,
                "--lock-dir": self._same_path("--lock-dir", state_dir / "locks"),
            },
        }
        if command not in allowed:
            raise Refused(f"{command!r} is not allowed (allowed: {', '.join(sorted(allowed))})")
        return allowed[command]

    def programs(self) -> set[str]:
        return {"mlx-medic"} | {node.medic_command for node in self.inventory.nodes}

    def check_probe_target(self, options: dict[str, str]) -> None:
        for required in ("--host", "--port"):
            if required not in options:
                raise Refused(f"probe needs {required}")
        host, port = options["--host"], int(options["--port"])
        for model in self.inventory.models:
            hosts = {model.host, WILDCARD_HOSTS.get(model.host, model.host)}
            if model.port == port and host in hosts:
                return
        raise Refused(f"no model in the inventory listens on {host} port {port}")


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


def _parse_options(
    words: list[str], allowed: dict[str, Callable[[str], str] | None], command: str
) -> dict[str, str]:
    """`--name value`, `--name=value` and flags, each at most once; nothing positional."""
    found: dict[str, str] = {}
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if not word.startswith("--"):
            raise Refused(f"unexpected argument {word!r} to {command!r}")
        name, has_value, value = word.partition("=")
        if name not in allowed:
            raise Refused(f"option {name!r} is not allowed for {command!r}")
        if name in found:
            raise Refused(f"option {name!r} given twice")
        check = allowed[name]
        if check is None:
            if has_value:
                raise Refused(f"option {name!r} takes no value")
            found[name] = ""
            continue
        if not has_value:
            if not rest:
                raise Refused(f"option {name!r} needs a value")
            value = rest.pop(0)
        found[name] = check(value)
    return found


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
        command, words_after = f"node {args[1]}", args[2:]
    else:
        command, words_after = args[0], args[1:]
    options = _parse_options(words_after, allowed.options(command), command)
    if command == "probe":
        allowed.check_probe_target(options)
    elif "--config.file" not in options:
        options["--config.file"] = str(allowed.config_file)  # the inventory this key runs with
    argv = command.split()
    for name, value in options.items():
        argv += [name] if allowed.options(command)[name] is None else [name, value]
    return argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config.file", dest="config_file", type=Path, required=True,
                        help="the inventory the allowed commands are checked against")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from mlx_medic.inventory import InventoryError, load_inventory

    config_file = Path(os.path.abspath(args.config_file))
    try:
        inventory = load_inventory(config_file)
    except InventoryError as exc:
        raise HelperError(exc.report()) from None
    original = os.environ.get("SSH_ORIGINAL_COMMAND")
    try:
        argv = validate(original, Allowed(inventory, config_file))
    except Refused as exc:
        print(f"mlx-medic forced command: refused {original!r}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "mlx_medic.cli", *argv])
