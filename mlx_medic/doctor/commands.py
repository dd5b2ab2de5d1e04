"""Every command `mlx-medic doctor` may run, in one allow-list, and the runner that holds
it to that list; and every node helper call it may send (`--config.file`: to every node
over SSH), in a second list, and the transport that holds it to that one.

The doctor looks and never touches: no service stop or start, no lock taken or dropped,
no sweep or clean but a dry run, no signal, no file removed. Each entry is an exact argv,
where a `{name}` stands for one word from the inventory (a label, a path, a user, a
model) that cannot start with `-`, so it never becomes an option.
tests/doctor/test_read_only.py checks the lists and runs every check through a recording
runner and a recording transport.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mlx_medic.node.facts import SW_VERS_ARGV
from mlx_medic.platform.commands import CompletedCommand, Runner
from mlx_medic.platform.macos_rdma import (
    IBV_DEVINFO_ARGV,
    IOCLASSCOUNT_ALL_ARGV,
    IOCLASSCOUNT_ARGV,
)
from mlx_medic.platform.proc_macos import PS_COMMAND
from mlx_medic.platform.temp_dirs import GETCONF_ARGV
from mlx_medic.service_manager import LAUNCHCTL
from mlx_medic.transport.interface import CommandResult, NodeTransport

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Node

# The packages whose versions an interpreter reports, and the script that reports them
# (one JSON object: its Python's version and each package's, null when not installed).
VERSIONED_PACKAGES = ("mlx", "mlx-lm", "mlx-medic")
VERSIONS_SCRIPT = (
    "import json, platform, sys\n"
    "from importlib.metadata import PackageNotFoundError, version\n"
    "def installed(name):\n"
    "    try:\n"
    "        return version(name)\n"
    "    except PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({'python': platform.python_version(),"
    " **{name: installed(name) for name in sys.argv[1:]}}))\n"
)

READ_ONLY_COMMANDS: tuple[tuple[str, ...], ...] = (
    PS_COMMAND,  # the process states the exporter reads
    IBV_DEVINFO_ARGV,
    IOCLASSCOUNT_ARGV,
    IOCLASSCOUNT_ALL_ARGV,  # the class names, when the RDMA ones are missing
    GETCONF_ARGV,  # as the service's user
    SW_VERS_ARGV,
    (LAUNCHCTL, "print", "system/{label}"),
    ("{medic_command}", "--version"),
    ("{python}", "-c", VERSIONS_SCRIPT, *VERSIONED_PACKAGES),
    ("sudo", "-n", "-l"),  # list the asking user's rules
    ("sudo", "-n", "-l", "-U", "{user}"),  # root lists the login user's
)

# The read-only form of each node helper call the remediator's arm makes (the words after
# `mlx-medic node`, before the tail every call carries: --inventory, --node, --json).
READ_ONLY_HELPER_CALLS: tuple[tuple[str, ...], ...] = (
    ("facts", "{model}"),
    ("orphans", "{model}"),
    ("sweep", "{model}", "--dry-run"),
    ("sweep", "{model}", "--orphans-only", "--dry-run"),
    ("clean", "{model}", "--dry-run"),
    ("service", "{model}", "status"),
    ("backend", "{model}", "show"),
    ("lock", "{model}", "show"),
    ("probe", "{model}", "--timeout", "{seconds}"),
    ("pid-alive", "1"),  # the model lock asks whether a holder lives; pid 1 always does
)

_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
_ONE_WORD = r"(?!-)\S+"


def _word(shape: str) -> re.Pattern[str]:
    literal = [re.escape(part) for part in _PLACEHOLDER.split(shape)]
    return re.compile(_ONE_WORD.join(literal))


Shapes = list[tuple[tuple[str, ...], list[re.Pattern[str]]]]


def _shapes(entries: tuple[tuple[str, ...], ...]) -> Shapes:
    return [(entry, [_word(word) for word in entry]) for entry in entries]


_SHAPES = _shapes(READ_ONLY_COMMANDS)
_HELPER_SHAPES = _shapes(READ_ONLY_HELPER_CALLS)


def allowed_as(argv: Sequence[str], shapes: Shapes = _SHAPES) -> tuple[str, ...] | None:
    """The allow-list entry `argv` is, word for word (READ_ONLY_COMMANDS unless `shapes`
    says another list); None: it is none of them."""
    for entry, words in shapes:
        if len(words) == len(argv) and all(
            w.fullmatch(a) for w, a in zip(words, argv, strict=True)
        ):
            return entry
    return None


def is_read_only(argv: Sequence[str]) -> bool:
    return allowed_as(argv) is not None


class NotReadOnly(RuntimeError):
    """A check asked for a command outside the allow-list: a bug, never run."""


def guarded(runner: Runner) -> Runner:
    """`runner`, refusing (before anything runs) every command not in the allow-list."""

    def run(argv: Sequence[str], timeout: float) -> CompletedCommand:
        if not is_read_only(argv):
            raise NotReadOnly(f"the doctor may not run `{' '.join(argv)}`")
        return runner(argv, timeout)

    return run


def helper_call_allowed_as(node: Node, argv: Sequence[str]) -> tuple[str, ...] | None:
    """The READ_ONLY_HELPER_CALLS entry `argv` calls on `node`, or None: `argv` must be
    the client's whole call (mlx_medic.node.client.helper_argv), the helper's words one
    of the entries."""
    from mlx_medic.node.client import helper_argv

    if len(argv) >= 2 and argv[-2] == "--time-limit":  # the caller's wait, on every call
        argv = argv[:-2]
    if len(argv) < 3 or list(argv[:2]) != [node.medic_command, "node"]:
        return None
    tail = helper_argv(node, "", [])[3:]
    words = list(argv[2 : len(argv) - len(tail)])
    if list(argv[len(argv) - len(tail) :]) != tail:
        return None
    return allowed_as(words, _HELPER_SHAPES)


class ReadOnlyTransport:
    """`transport`, refusing (before it is sent) every command that is not a read-only
    helper call; NotReadOnly says which."""

    def __init__(self, transport: NodeTransport):
        self.transport = transport

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if helper_call_allowed_as(node, argv) is None:
            raise NotReadOnly(f"the doctor may not send `{' '.join(argv)}` to {node.name}")
        return await self.transport.run(node, argv, timeout=timeout)

    async def close(self) -> None:
        await self.transport.close()
