"""One process as a process-table snapshot sees it: its state, its role and the
environment variables mlx-medic reads from it, its ancestry in the snapshot, and the
protocol every platform's process table follows.

The leaf of the process model: the platform tables (`mlx_medic.platform`) build on it,
and it imports no platform module. What a command line runs is
`mlx_medic.processes.command_line`, the role it proves `mlx_medic.processes.roles`, the
model it serves `mlx_medic.processes.scope`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class State(StrEnum):
    """The closed set of process states every platform maps onto."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    UNINTERRUPTIBLE = "uninterruptible"
    STOPPED = "stopped"
    ZOMBIE = "zombie"


class Role(StrEnum):
    """What an MLX process is for; the `role` label of the process metrics."""

    LAUNCHER = "launcher"  # mlx.launch
    SSH_CLIENT = "ssh_client"  # `ssh -tt host <launch script>` started by mlx.launch
    RANK = "rank"  # mlx_lm server, a model's `rank` pattern, or anything started with MLX_RANK
    SHARE = "share"  # mlx_lm.share, or a model's `share` pattern (the seed's mlx-share-rank.py)
    EXO_RUNNER = "exo_runner"  # a multiprocessing child of exo


# Environment variables read (lazily) from scoped processes.
ENV_RANK = "MLX_RANK"
ENV_RUN_ID = "MLX_MEDIC_RUN_ID"
ENV_MODEL = "MLX_MEDIC_MODEL"
# What mlx.launch hands every rank about its launch's placement (launch.py launch_ring,
# launch_jaccl): the paths of temporary files whose content every rank of one launch
# shares, and JACCL's coordinator address. See mlx_medic.processes.placement.
ENV_HOSTFILE = "MLX_HOSTFILE"  # ring: a mktemp file holding the ranks' ip:port lists
ENV_IBV_DEVICES = "MLX_IBV_DEVICES"  # jaccl: a mktemp file holding the RDMA device matrix
ENV_JACCL_COORDINATOR = "MLX_JACCL_COORDINATOR"  # jaccl: rank 0's ip:port
ENV_JACCL_RING = "MLX_JACCL_RING"  # jaccl-ring
PLACEMENT_ENV = (ENV_HOSTFILE, ENV_IBV_DEVICES, ENV_JACCL_COORDINATOR, ENV_JACCL_RING)
WATCHED_ENV = (ENV_RANK, ENV_RUN_ID, ENV_MODEL, *PLACEMENT_ENV)


@dataclass
class ProcessInfo:
    """One process as a table snapshot saw it.

    `env` holds only WATCHED_ENV and is read on first use: reading a process's
    environment costs a file read (Linux) or a sysctl (macOS), and most
    processes never need it.
    """

    pid: int
    ppid: int
    state: State
    cmdline: tuple[str, ...]
    create_time: float  # seconds since the epoch
    name: str = ""  # the kernel's short name (comm), e.g. "sshd"
    role: Role | None = None  # filled by the table from classify()
    env_loader: Callable[[], Mapping[str, str]] | None = field(default=None, repr=False)
    _env: Mapping[str, str] | None = field(default=None, repr=False)

    @property
    def env(self) -> Mapping[str, str]:
        if self._env is None:
            loaded: Mapping[str, str] = {}
            if self.env_loader is not None:
                try:
                    loaded = self.env_loader()
                except (OSError, ValueError):
                    loaded = {}
            self._env = {k: v for k, v in loaded.items() if k in WATCHED_ENV}
        return self._env

    @property
    def run_id(self) -> str | None:
        return self.env.get(ENV_RUN_ID) or None


def parse_environ(raw: bytes) -> dict[str, str]:
    """The watched variables from a NUL-separated environment block."""
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key.decode("ascii", "replace") in WATCHED_ENV:
            found[key.decode()] = value.decode("utf-8", "replace")
    return found


# --- ancestry over a snapshot --------------------------------------------------


def by_pid(processes: Iterable[ProcessInfo]) -> dict[int, ProcessInfo]:
    return {p.pid: p for p in processes}


def ancestors(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> list[ProcessInfo]:
    """Parent, grandparent, ... as far as the snapshot knows them."""
    found: list[ProcessInfo] = []
    seen = {proc.pid}
    pid = proc.ppid
    while pid in table and pid not in seen:
        seen.add(pid)
        parent = table[pid]
        found.append(parent)
        pid = parent.ppid
    return found


# --- process tables -------------------------------------------------------------


class ProcessTable(Protocol):
    """A platform's view of the process table.

    `snapshot()` returns the processes that have a role (or may get one from
    their ancestry) plus all their ancestors; unrelated processes are left out,
    which is what keeps a scrape cheap on a busy node.
    """

    def snapshot(self) -> list[ProcessInfo]: ...


# A command line can change without a new pid: `bash -c '...; exec python -m
# mlx_lm.server'` (mlx.launch's own launch script) and pyenv shims exec into
# the rank. Tables cache classification per process, so they look again at
# these ages (seconds since first seen), then every RECHECK_EVERY seconds.
RECHECK_AFTER = (1.0, 5.0, 30.0, 120.0)
RECHECK_EVERY = 600.0


def next_check(first_seen: float, checks_done: int) -> float:
    """When a cached classification should be looked at again."""
    if checks_done < len(RECHECK_AFTER):
        return first_seen + RECHECK_AFTER[checks_done]
    extra = checks_done - len(RECHECK_AFTER) + 1
    return first_seen + RECHECK_AFTER[-1] + extra * RECHECK_EVERY
