"""The role of an MLX process: what it is for (launcher, ssh client, rank, share rank,
exo runner).

Roles come from anchored command-line matching (the interpreter, then `-m
module` or the script's own name), never from a substring anywhere in the
command line, so `grep mlx_lm.server` or a uvx wrapper that mentions the module
is not mistaken for a rank. Then from the inventory's process patterns, then from
`MLX_RANK` in the environment; exo's runners by their ancestry. The exporter and the
remediator both import this.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mlx_medic.processes.command_line import (
    Invocation,
    basename,
    command_text,
    invocation,
    launched_command,
)
from mlx_medic.processes.info import ENV_RANK, ProcessInfo, Role, ancestors

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.schema import Inventory

_LAUNCHER_MODULES = {"mlx.launch", "mlx._distributed_utils.launch"}
_LAUNCHER_SCRIPTS = {"mlx.launch"}


@dataclass(frozen=True)
class ProcessPattern:
    """One of a model's `process_patterns`: a command that is the model's `role`."""

    model: str
    role: Role
    regex: re.Pattern[str]

    def matches(self, text: str) -> bool:
        return self.regex.fullmatch(text) is not None


class PatternSet:
    """Every model's process patterns, matched in inventory order (the first match wins)."""

    def __init__(self, patterns: Iterable[ProcessPattern] = ()):
        self.patterns = tuple(patterns)

    @classmethod
    def of(cls, inventory: Inventory | None) -> PatternSet:
        found = []
        for model in inventory.models if inventory is not None else ():
            for role, regex in model.process_patterns.compiled():
                found.append(ProcessPattern(model.name, Role(role), regex))
        return cls(found)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def match(self, cmdline: Sequence[str]) -> ProcessPattern | None:
        if not self.patterns:
            return None
        text = command_text(cmdline)
        if text is None:
            return None
        return next((p for p in self.patterns if p.matches(text)), None)


NO_PATTERNS = PatternSet()


def _mlx_lm_role(inv: Invocation) -> Role | None:
    """`-m mlx_lm.server`, `-m mlx_lm server`, and the `mlx_lm.server` script."""
    target = inv.target
    if inv.kind not in ("module", "script", "program"):
        return None
    sub = inv.args[0] if inv.args else ""
    if target in ("mlx_lm.server", "mlx_lm.server.py") or (target == "mlx_lm" and sub == "server"):
        return Role.RANK
    if target in ("mlx_lm.share", "mlx_lm.share.py") or (target == "mlx_lm" and sub == "share"):
        return Role.SHARE
    return None


def classify_cmdline(cmdline: Sequence[str]) -> Role | None:
    """The role a command line alone proves, or None.

    Ranks started by mlx.launch under another name (the seed's `serve.py`) are found by
    their model's process patterns, else through MLX_RANK; see `classify`.
    """
    inv = invocation(cmdline)
    if inv is None:
        return None
    if (inv.kind == "module" and inv.target in _LAUNCHER_MODULES) or (
        inv.kind in ("script", "program") and inv.target in _LAUNCHER_SCRIPTS
    ):
        return Role.LAUNCHER
    if launched_command(cmdline) is not None:
        return Role.SSH_CLIENT
    return _mlx_lm_role(inv)


def classify(
    cmdline: Sequence[str],
    env: Callable[[], Mapping[str, str]],
    patterns: PatternSet = NO_PATTERNS,
) -> Role | None:
    """Role from the command line (mlx.launch, its ssh clients, mlx_lm), else from the
    inventory's process patterns, else RANK if it was started with MLX_RANK."""
    role = classify_cmdline(cmdline)
    if role is not None:
        return role
    if is_exo_spawn_child(cmdline) or is_exo_main(cmdline):
        return None  # decided by ancestry in resolve_exo_runners
    found = patterns.match(cmdline)
    if found is not None:
        return found.role
    return Role.RANK if ENV_RANK in env() else None


Classifier = Callable[[Sequence[str], Callable[[], Mapping[str, str]]], Role | None]


def classifier(patterns: PatternSet) -> Classifier:
    """`classify` with the inventory's process patterns, for a process table."""
    if not patterns:
        return classify
    return lambda cmdline, env: classify(cmdline, env, patterns)


def is_exo_main(cmdline: Sequence[str]) -> bool:
    inv = invocation(cmdline)
    if inv is None:
        return False
    if inv.kind == "module":
        return inv.target == "exo" or inv.target.startswith("exo.main")
    return inv.kind in ("script", "program") and inv.target == "exo"


def is_exo_interpreter(cmdline: Sequence[str]) -> bool:
    """An interpreter inside an exo install (`/opt/exo/.venv/bin/python`): how a runner
    whose exo parent is already gone is still known for what it is."""
    if not cmdline:
        return False
    parts = PurePosixPath(cmdline[0]).parts[:-1]
    return any(p == "exo" or p.startswith(("exo-", "exo_", "exo.")) for p in parts)


def is_exo_spawn_child(cmdline: Sequence[str]) -> bool:
    """A multiprocessing spawn child (what exo starts runners as)."""
    inv = invocation(cmdline)
    return (
        inv is not None
        and inv.kind == "code"
        and "--multiprocessing-fork" in inv.args
        and "spawn_main" in inv.args[0]  # the -c code, after any interpreter flags (-B, -s)
    )


def is_sshd_session(proc: ProcessInfo) -> bool:
    """An sshd serving one connection (`sshd: root@pts/0`, `sshd-session`).

    The listener (`sshd: /usr/sbin/sshd -D [listener] ...`) is not: it never
    holds a client's connection, and in the testbed it is pid 1, adopting
    orphans as launchd would.
    """
    first = proc.cmdline[0] if proc.cmdline else ""
    if "[listener]" in first:
        return False
    if basename(first) == "sshd-session" or first.startswith(("sshd:", "sshd-session:")):
        return True
    return proc.name == "sshd-session"


def has_exo_ancestor(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> bool:
    return any(is_exo_main(a.cmdline) for a in ancestors(proc, table))


def resolve_exo_runners(table: Mapping[int, ProcessInfo]) -> None:
    """Spawn children under an exo main process, or run by exo's own interpreter
    (an orphan whose exo parent is gone), are exo runners."""
    for proc in table.values():
        if (
            proc.role is None
            and is_exo_spawn_child(proc.cmdline)
            and (is_exo_interpreter(proc.cmdline) or has_exo_ancestor(proc, table))
        ):
            proc.role = Role.EXO_RUNNER
