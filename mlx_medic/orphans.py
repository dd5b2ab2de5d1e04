"""Orphan rules a node can apply alone, over one process-table snapshot.

`ppid == 1` is never the test: on a peer an orphaned rank keeps its stuck
`sshd` as parent (the seed incident). Each orphan carries the rule that found
it, so an alert can say why. Rules are pure functions of the snapshot plus two
injected lookups (the model's current run, an sshd's live connection) so they
are tested on synthetic tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from mlx_medic.process_model import (
    ENV_RANK,
    ENV_RUN_ID,
    ModelScoper,
    ProcessInfo,
    Role,
    State,
    ancestors,
    has_exo_ancestor,
    is_sshd_session,
    launch_script_env,
    ssh_destination,
)

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory import Inventory


class Rule(StrEnum):
    """Why a process is an orphan; the `rule` label value."""

    STALE_RUN_ID = "stale_run_id"  # its run id is not the model's current run here
    LAUNCHER_GONE = "launcher_gone"  # its launcher (mlx.launch, or exo for a runner) is gone
    SSH_CLIENT_LOST = "ssh_client_lost"  # its sshd session has no client any more
    EXCESS_RANKS = "excess_ranks"  # more ranks here than the model places here


@dataclass(frozen=True)
class Scoped:
    """A process with a role, in a model's scope."""

    proc: ProcessInfo
    model: str

    @property
    def role(self) -> Role:
        assert self.proc.role is not None
        return self.proc.role


@dataclass(frozen=True)
class Orphan:
    proc: ProcessInfo
    model: str
    rule: Rule

    @property
    def role(self) -> Role:
        assert self.proc.role is not None
        return self.proc.role


@dataclass
class OrphanReport:
    orphans: list[Orphan] = field(default_factory=list)
    # (model, peer) -> orphaned ssh clients of a dead launch that point at the peer
    suspected_remote: Counter[tuple[str, str]] = field(default_factory=Counter)

    def rule_of(self, pid: int) -> Rule | None:
        for orphan in self.orphans:
            if orphan.proc.pid == pid:
                return orphan.rule
        return None


CurrentRun = Callable[[str], str | None]  # model -> current run id on this node
Established = Callable[[ProcessInfo], bool | None]  # sshd -> holds a live TCP connection?


def scope(snapshot: Iterable[ProcessInfo], scoper: ModelScoper) -> list[Scoped]:
    """The snapshot's processes that have a role and belong to a model."""
    found = []
    for proc in snapshot:
        if proc.role is None:
            continue
        model = scoper.model_of(proc)
        if model is not None:
            found.append(Scoped(proc, model))
    return found


def run_id_of(proc: ProcessInfo) -> str | None:
    """The run tag of a rank (its environment) or an ssh client (its launch script)."""
    return proc.run_id or launch_script_env(proc.cmdline).get(ENV_RUN_ID) or None


def stale_run_id(item: Scoped, current_run: CurrentRun) -> bool:
    tag = run_id_of(item.proc)
    if tag is None:
        return False
    current = current_run(item.model)
    return current is not None and tag != current


def launcher_gone(item: Scoped, table: Mapping[int, ProcessInfo]) -> bool:
    """A launched rank or ssh client with no mlx.launch above it, or an exo runner
    with no exo above it (exo PR 2205: it keeps Metal memory and queue pairs).

    A rank under an sshd session was launched from another node; its launcher
    is not ours to see, so `ssh_client_lost` judges it instead. A rank whose
    session is gone too (adopted by init, or by the testbed's sshd pid 1) is
    judged here.
    """
    role = item.role
    if role == Role.EXO_RUNNER:
        return not has_exo_ancestor(item.proc, table)  # its exo worker was killed
    if role == Role.SSH_CLIENT:
        launched = True
    elif role in (Role.RANK, Role.SHARE):
        launched = ENV_RANK in item.proc.env
    else:
        return False
    if not launched:
        return False
    above = ancestors(item.proc, table)
    # mlx_lm.share launches its own ranks (launch_ring in-process): it is a launcher too.
    if any(a.role in (Role.LAUNCHER, Role.SHARE) for a in above):
        return False
    return role == Role.SSH_CLIENT or not any(is_sshd_session(a) for a in above)


def ssh_client_lost(
    item: Scoped, table: Mapping[int, ProcessInfo], established: Established
) -> bool:
    """On a peer: a rank under sshd sessions none of which still has its client."""
    if item.role not in (Role.RANK, Role.SHARE):
        return False
    sshds = [a for a in ancestors(item.proc, table) if is_sshd_session(a)]
    if not sshds:
        return False
    answers = [established(s) for s in sshds]
    if any(answer is None for answer in answers):
        return False  # could not tell: never call a rank orphaned on a guess
    return not any(answers)


def _allowed_ranks(model: str, node: str | None, inventory: Inventory | None) -> int | None:
    if inventory is None:
        return None
    try:
        placed = inventory.model(model)
    except KeyError:
        return None
    return placed.ranks_per_node if node in placed.nodes else 0


def find_orphans(
    scoped: list[Scoped],
    table: Mapping[int, ProcessInfo],
    *,
    node: str | None,  # None: discovery mode (no inventory names this node)
    inventory: Inventory | None,
    current_run: CurrentRun,
    established: Established,
) -> OrphanReport:
    """Apply every rule; each orphan gets the first rule that finds it."""
    report = OrphanReport()
    judged: set[int] = set()
    for item in scoped:
        rule: Rule | None = None
        if stale_run_id(item, current_run):
            rule = Rule.STALE_RUN_ID
        elif launcher_gone(item, table):
            rule = Rule.LAUNCHER_GONE
        elif ssh_client_lost(item, table, established):
            rule = Rule.SSH_CLIENT_LOST
        if rule is None:
            continue
        report.orphans.append(Orphan(item.proc, item.model, rule))
        judged.add(item.proc.pid)
        if item.role == Role.SSH_CLIENT:
            peer = ssh_destination(item.proc.cmdline)
            if peer:
                report.suspected_remote[(item.model, peer_name(peer, inventory))] += 1

    # Excess ranks: keep the newest live ranks the model places here.
    ranks: dict[str, list[Scoped]] = {}
    for item in scoped:
        if item.role == Role.RANK and item.proc.pid not in judged:
            ranks.setdefault(item.model, []).append(item)
    for model, items in ranks.items():
        allowed = _allowed_ranks(model, node, inventory)
        if allowed is None or len(items) <= allowed:
            continue
        items.sort(key=lambda s: (s.proc.state != State.ZOMBIE, s.proc.create_time), reverse=True)
        for item in items[allowed:]:
            report.orphans.append(Orphan(item.proc, model, Rule.EXCESS_RANKS))
    return report


def peer_name(address: str, inventory: Inventory | None) -> str:
    """The inventory node an ssh destination names, else the address itself."""
    if inventory is not None:
        for node in inventory.nodes:
            if address in (node.ssh, node.name):
                return node.name
    return address


def psutil_established(proc: ProcessInfo) -> bool | None:
    """Whether a process holds an ESTABLISHED TCP connection (None: cannot tell)."""
    import psutil

    try:
        connections = psutil.Process(proc.pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False  # the session process is gone: its client is gone with it
    except (psutil.AccessDenied, OSError):
        return None
    return any(c.status == psutil.CONN_ESTABLISHED for c in connections)
