"""Every command `mlx-medic doctor` may run, in one allow-list, and the runner that holds
it to that list.

The doctor looks and never touches: no service stop or start, no lock, no sweep or clean,
no signal, no file removed. Each entry is an exact argv, where a `{name}` stands for one
word from the inventory (a label, a path, a user) that cannot start with `-`, so it never
becomes an option. tests/doctor/test_read_only.py checks the list and runs every check
through a recording runner.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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

_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
_ONE_WORD = r"(?!-)\S+"


def _word(shape: str) -> re.Pattern[str]:
    literal = [re.escape(part) for part in _PLACEHOLDER.split(shape)]
    return re.compile(_ONE_WORD.join(literal))


_SHAPES = [(entry, [_word(word) for word in entry]) for entry in READ_ONLY_COMMANDS]


def allowed_as(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The READ_ONLY_COMMANDS entry `argv` is, word for word; None: it is none of them."""
    for entry, words in _SHAPES:
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
