"""Orphan rules a node can apply alone, over one process-table snapshot.

`ppid == 1` is never the test: on a peer an orphaned rank keeps its stuck
`sshd` as parent (the seed incident). Each orphan carries the rule that found
it, so an alert can say why. Where at most some of a model's ranks can be current
and nothing tells which, they are reported as suspects, apart from the orphans:
suspects are shown, never acted on. A rank that serves the model's port is
never an orphan nor a suspect. Rules are pure functions of the snapshot plus
injected lookups (the model's current run, an sshd's live connection, a
process's listening ports, a rank's placement) so they are tested on synthetic
tables. The rules stay in one module (about 460 lines) because each one's verdict
is read against the others' (a rank one rule clears, another must not flag).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from mlx_medic.processes.command_line import flag_value, launch_script_env, ssh_destination
from mlx_medic.processes.info import ENV_RANK, ENV_RUN_ID, ProcessInfo, Role, State, ancestors
from mlx_medic.processes.placement import Placement, placement_of_ssh_client
from mlx_medic.processes.roles import has_exo_ancestor, is_sshd_session
from mlx_medic.processes.scope import ModelScoper, scope_argv

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.schema import Inventory


class Rule(StrEnum):
    """Why a process is an orphan; the `rule` label value."""

    STALE_RUN_ID = "stale_run_id"  # its run id is not the model's current run here
    LAUNCHER_GONE = "launcher_gone"  # its launcher (mlx.launch, or exo for a runner) is gone
    SSH_CLIENT_LOST = "ssh_client_lost"  # its sshd session has no client any more
    # another live rank with its placement and rank number is the current one
    DUPLICATE_RANK = "duplicate_rank"
    EXCESS_RANKS = "excess_ranks"  # more ranks here than the model places here


class SuspectRule(StrEnum):
    """Why a process may be an orphan though nothing decides it; the suspects' `rule`."""

    # live ranks with the same placement and rank number: one at most is current
    DUPLICATE_RANK_UNDECIDED = "duplicate_rank_undecided"
    # more ranks here than the model places here: which are current is not known
    EXCESS_RANKS_UNDECIDED = "excess_ranks_undecided"


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


@dataclass(frozen=True)
class Suspect:
    """A process that may be an orphan: shown, never swept."""

    proc: ProcessInfo
    model: str
    rule: SuspectRule

    @property
    def role(self) -> Role:
        assert self.proc.role is not None
        return self.proc.role


@dataclass
class OrphanReport:
    """What one snapshot shows. A sweep acts on `orphans` only; `suspects` are kept
    apart so that nothing that counts or removes orphans ever takes one of them."""

    orphans: list[Orphan] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    # (model, peer) -> orphaned ssh clients of a dead launch that point at the peer
    suspected_remote: Counter[tuple[str, str]] = field(default_factory=Counter)

    def rule_of(self, pid: int) -> Rule | None:
        for orphan in self.orphans:
            if orphan.proc.pid == pid:
                return orphan.rule
        return None

    def suspect_rule_of(self, pid: int) -> SuspectRule | None:
        for suspect in self.suspects:
            if suspect.proc.pid == pid:
                return suspect.rule
        return None


CurrentRun = Callable[[str], str | None]  # model -> current run id on this node
Established = Callable[[ProcessInfo], bool | None]  # sshd -> holds a live TCP connection?
Listening = Callable[[ProcessInfo, int], bool | None]  # listens on this TCP port?
PlacementOf = Callable[[ProcessInfo], Placement | None]  # a rank's launch placement


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


class Evidence:
    """What tells a current rank from a left-over one, each answer cached for one snapshot.

    True, False, or None (cannot tell; never read as False).
    """

    def __init__(
        self,
        table: Mapping[int, ProcessInfo],
        inventory: Inventory | None,
        established: Established,
        listening: Listening,
    ):
        self.table = table
        self.inventory = inventory
        self._established = established
        self._listening = listening
        self._sessions: dict[int, bool | None] = {}
        self._serving: dict[int, bool | None] = {}

    def established(self, sshd: ProcessInfo) -> bool | None:
        if sshd.pid not in self._sessions:
            self._sessions[sshd.pid] = self._established(sshd)
        return self._sessions[sshd.pid]

    def model_port(self, item: Scoped) -> int | None:
        """The inventory's port for the model, else the rank's own `--port`."""
        if self.inventory is not None:
            try:
                return self.inventory.model(item.model).port
            except KeyError:
                pass
        port = flag_value(scope_argv(item.proc.cmdline), "--port")
        return int(port) if port is not None and port.isdigit() else None

    def serves(self, item: Scoped) -> bool | None:
        """A rank that listens on the model's port: the one the service answers from."""
        if item.role not in (Role.RANK, Role.SHARE) or item.proc.state is State.ZOMBIE:
            return False
        if item.proc.pid not in self._serving:
            port = self.model_port(item)
            listens = self._listening(item.proc, port) if port is not None else False
            self._serving[item.proc.pid] = listens
        return self._serving[item.proc.pid]

    @staticmethod
    def alive(item: Scoped) -> bool:
        return item.proc.state is not State.ZOMBIE

    def attached(self, item: Scoped) -> bool | None:
        """Still held by whoever started it: a live launcher above it, or an sshd session
        above it whose client is still connected."""
        above = ancestors(item.proc, self.table)
        if any(a.role in (Role.LAUNCHER, Role.SHARE) for a in above):
            return True
        answers = [self.established(a) for a in above if is_sshd_session(a)]
        if True in answers:
            return True
        return None if None in answers else False


def choose(
    members: Sequence[Scoped], keep: int, evidence: Evidence
) -> tuple[list[Scoped], list[Scoped]]:
    """(orphans, undecided) among `members`, of which at most `keep` can be current.

    Ranks that serve the model's port are current and never returned. Then, test by
    test (alive, attached), a member that lacks what another has is left out, as long
    as `keep` remain. If at most `keep` remain, the others are orphans; if more, which
    are current is not known: they are undecided, never guessed (not by age either: a
    newer launch attempt that failed may linger beside the serving rank).
    """
    serving = [m for m in members if evidence.serves(m) is True]
    remaining = [m for m in members if m not in serving]
    keep = max(0, keep - len(serving))
    if keep > 0:
        for test in (evidence.alive, evidence.attached):
            if len(remaining) <= keep:
                break
            verdicts = [(m, test(m)) for m in remaining]
            if any(v is True for _, v in verdicts):
                candidates = [m for m, v in verdicts if v is not False]
                if len(candidates) >= keep:
                    remaining = candidates
    else:
        remaining = []
    losers = [m for m in members if m not in remaining and m not in serving]
    if len(remaining) <= keep:
        return losers, []
    return losers, remaining


def _allowed_ranks(
    model: str, node: str | None, inventory: Inventory | None, placements: Iterable[Placement]
) -> int | None:
    """Ranks the model runs here: the inventory's count, raised to what a live rank's own
    launch places here (that launch is what runs); None without an inventory."""
    if inventory is None:
        return None
    try:
        placed = inventory.model(model)
    except KeyError:
        return None
    if node not in placed.nodes:
        return 0
    return max([placed.ranks_per_node, *(p.ranks_here for p in placements)])


def find_orphans(
    scoped: list[Scoped],
    table: Mapping[int, ProcessInfo],
    *,
    node: str | None,  # None: discovery mode (no inventory names this node)
    inventory: Inventory | None,
    current_run: CurrentRun,
    established: Established,
    listening: Listening,
    placement_of: PlacementOf,
) -> OrphanReport:
    """Apply every rule; each orphan gets the first rule that finds it.

    1. Per process: stale_run_id, launcher_gone, ssh_client_lost (never a serving rank;
       never the ssh client of a dead launch whose rank still serves here).
    2. duplicate_rank: live ranks with the same placement and rank number.
    3. excess_ranks (with an inventory): more ranks than the model runs here.
    """
    judge = _Judge(
        table, inventory, Evidence(table, inventory, established, listening), placement_of
    )
    judge.per_process(scoped, current_run)
    judge.duplicates(scoped)
    judge.excess(scoped, node)
    return judge.report


class _Judge:
    """One snapshot's verdicts, built rule by rule; a process judged once is done."""

    def __init__(
        self,
        table: Mapping[int, ProcessInfo],
        inventory: Inventory | None,
        evidence: Evidence,
        placement_of: PlacementOf,
    ):
        self.table = table
        self.inventory = inventory
        self.evidence = evidence
        self.placement_of = placement_of
        self.report = OrphanReport()
        self.judged: set[int] = set()
        self._placements: dict[int, Placement | None] = {}

    def placement(self, item: Scoped) -> Placement | None:
        pid = item.proc.pid
        if pid not in self._placements:
            live = item.proc.state is not State.ZOMBIE
            self._placements[pid] = self.placement_of(item.proc) if live else None
        return self._placements[pid]

    def orphan(self, item: Scoped, rule: Rule) -> None:
        self.report.orphans.append(Orphan(item.proc, item.model, rule))
        self.judged.add(item.proc.pid)
        if item.role == Role.SSH_CLIENT:
            peer = ssh_destination(item.proc.cmdline)
            if peer:
                self.report.suspected_remote[(item.model, peer_name(peer, self.inventory))] += 1

    def suspect(self, items: Iterable[Scoped], rule: SuspectRule) -> None:
        for item in items:
            self.report.suspects.append(Suspect(item.proc, item.model, rule))
            self.judged.add(item.proc.pid)

    def unjudged(self, scoped: Iterable[Scoped], *roles: Role) -> list[Scoped]:
        return [s for s in scoped if s.role in roles and s.proc.pid not in self.judged]

    def per_process(self, scoped: list[Scoped], current_run: CurrentRun) -> None:
        serving_launches: set[tuple[str, str]] = set()  # (model, placement): dead, serving
        dead_launch_clients: dict[tuple[str, str, int], list[Scoped]] = {}
        for item in scoped:
            rule: Rule | None = None
            if stale_run_id(item, current_run):
                rule = Rule.STALE_RUN_ID
            elif launcher_gone(item, self.table):
                rule = Rule.LAUNCHER_GONE
            elif ssh_client_lost(item, self.table, self.evidence.established):
                rule = Rule.SSH_CLIENT_LOST
            if rule is None:
                continue
            if self.evidence.serves(item) is True:
                # The service answers from it: current, whatever else. It still counts
                # among the model's ranks below.
                launch = self.placement(item)
                if rule is Rule.LAUNCHER_GONE and launch is not None:
                    serving_launches.add((item.model, launch.key))
                continue
            if item.role == Role.SSH_CLIENT and rule is Rule.LAUNCHER_GONE:
                launch = placement_of_ssh_client(item.proc.cmdline)
                if launch is not None:  # decided once every serving rank is known
                    key = (item.model, launch.key, launch.rank)
                    dead_launch_clients.setdefault(key, []).append(item)
                    continue
            self.orphan(item, rule)
        # A dead launch whose rank still serves here is the model's run: its ssh clients
        # hold its peer ranks. One client per peer rank is kept; several (older launches
        # with the same placement) cannot be told apart.
        for (model, launch_key, _rank), clients in dead_launch_clients.items():
            if (model, launch_key) not in serving_launches:
                for client in clients:
                    self.orphan(client, Rule.LAUNCHER_GONE)
            elif len(clients) > 1:
                self.suspect(clients, SuspectRule.DUPLICATE_RANK_UNDECIDED)
            else:
                self.judged.add(clients[0].proc.pid)

    def duplicates(self, scoped: list[Scoped]) -> None:
        """One launch placement holds one process per rank number."""
        groups: dict[tuple[str, Role, str, int], list[Scoped]] = {}
        for item in self.unjudged(scoped, Role.RANK, Role.SHARE):
            launch = self.placement(item)
            if launch is not None:
                key = (item.model, item.role, launch.key, launch.rank)
                groups.setdefault(key, []).append(item)
        for members in groups.values():
            if len(members) > 1:
                orphans, undecided = choose(members, 1, self.evidence)
                for item in orphans:
                    self.orphan(item, Rule.DUPLICATE_RANK)
                self.suspect(undecided, SuspectRule.DUPLICATE_RANK_UNDECIDED)

    def excess(self, scoped: list[Scoped], node: str | None) -> None:
        """More ranks left than the model runs here."""
        ranks: dict[str, list[Scoped]] = {}
        for item in self.unjudged(scoped, Role.RANK):
            ranks.setdefault(item.model, []).append(item)
        for model, items in ranks.items():
            launches = [p for p in map(self.placement, items) if p is not None]
            allowed = _allowed_ranks(model, node, self.inventory, launches)
            if allowed is None or len(items) <= allowed:
                continue
            orphans, undecided = choose(items, allowed, self.evidence)
            for item in orphans:
                self.orphan(item, Rule.EXCESS_RANKS)
            self.suspect(undecided, SuspectRule.EXCESS_RANKS_UNDECIDED)


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
