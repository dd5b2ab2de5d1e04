"""What both process tables cache per process: its argv, its role, when to look again.

Reading every process's command line on every scrape is what makes a naive
exporter expensive on a node with thousands of unrelated processes. Both
tables (Linux: /proc; macOS: psutil) keep one `CachedCommand` per process and
call `recheck` only for a new process or when its re-check is due
(`next_check`: a process can `exec` into a rank under the same pid). How a
table reads argv and environment, and how it tells a new process from an old
one with the same pid, stays in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from mlx_medic.processes.info import Role, next_check
from mlx_medic.processes.roles import Classifier, classify, is_exo_spawn_child

EnvReader = Callable[[], dict[str, str]]


@dataclass(slots=True)  # one per process on the node: thousands on a busy one
class CachedCommand:
    """What does not change for one process (until it execs)."""

    cmdline: tuple[str, ...]
    role: Role | None = None
    candidate: bool = False  # has a role, or may get one from its ancestry (exo)
    first_seen: float = 0.0
    checks: int = 0
    due: float = 0.0
    env: dict[str, str] | None = None

    def env_loader(self, read: EnvReader) -> EnvReader:
        """A loader that reads the environment once, on first use, and keeps it."""

        def load() -> dict[str, str]:
            if self.env is None:
                self.env = read()
            return self.env

        return load


Cached = TypeVar("Cached", bound=CachedCommand)


def recheck(
    old: Cached | None,
    cmdline: tuple[str, ...],
    now: float,
    read_env: EnvReader,
    new: Callable[[tuple[str, ...]], Cached],
    classifier: Classifier = classify,
) -> Cached:
    """The entry for a process whose argv was just read (`old`: the same process's entry).

    An unchanged argv, or an empty one (a zombie's is gone), keeps `old` and moves
    its next re-check on; a changed one is classified afresh (by `classifier`: the
    inventory's process patterns ride on it) but keeps the schedule. The environment is
    read only if the argv alone cannot decide.
    """
    if old is not None:
        old.checks += 1
        old.due = next_check(old.first_seen, old.checks)
        if not cmdline or cmdline == old.cmdline:
            return old
    entry = new(cmdline)
    if old is not None:
        entry.first_seen, entry.checks, entry.due = old.first_seen, old.checks, old.due
    else:
        entry.first_seen, entry.checks, entry.due = now, 0, next_check(now, 0)
    if cmdline:
        entry.role = classifier(cmdline, entry.env_loader(read_env))
        entry.candidate = entry.role is not None or is_exo_spawn_child(cmdline)
    return entry
