"""What every step is: an object that describes itself and runs itself.

Why describe and run apart: the whole run is shown (dry run, on-call log) and each step
journaled before any of it happens. A step only does its one thing and says how it
ended; what follows (the next step, a fallback, an escalation) is the engine's to decide.
"""

from __future__ import annotations

import asyncio
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import REMEDIATOR, NodeHelpers
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.processes.survivors import SurvivorVerdict
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.transport import NodeTransport

if TYPE_CHECKING:
    from mlx_medic.remediator.journal import Journal

HealthCheck = Callable[[Model], Awaitable[HealthVerdict]]
# Who acts, as a node's records say it (`remediator run 12 (pid 4242 on medic-a)`):
# start-up tells a stop of its own interrupted run from anyone else's by it.
REMEDIATOR_RUN = "remediator run "
_RUN_BY = re.compile(
    r"remediator run (?P<run>[0-9]+)(?: \(pid (?P<pid>[0-9]+) on (?P<host>\S+)\))?"
)


def run_by(run_id: int, host: str | None = None, pid: int | None = None) -> str:
    """Who acts, as the head's records say it: the run, and its replica's pid and host
    (two replicas' journals number their runs alike, so the run id alone names none)."""
    replica = f" (pid {pid} on {host})" if host and pid else ""
    return f"{REMEDIATOR_RUN}{run_id}{replica}"


def is_run_by(said: str, run_id: int, host: str | None, pid: int | None) -> bool:
    """Whether a record's `said` (run_by's words) is that run of that replica; a record
    naming no replica (written before records named one) is the run id's alone."""
    found = _RUN_BY.fullmatch(said)
    if found is None or int(found["run"]) != run_id:
        return False
    return found["host"] is None or (found["host"], found["pid"]) == (host, str(pid))


async def _no_lock() -> None:
    """A context without a lock to let go of (a dry run, a test)."""


class StepKind(StrEnum):
    ACTION = "action"
    VERIFY = "verify"  # ok ends the run as succeeded; failed moves on to the fallback


@dataclass(frozen=True)
class StepDescription:
    """What the dry run shows and the journal records before the step starts."""

    name: str
    node: str
    description: str
    targets: list[str] = field(default_factory=list)
    argv: list[str] | None = None  # the exact command, when the step is one command
    # when the step runs, if not always: "only if the start fails verification"
    condition: str | None = None


@dataclass
class StepResult:
    outcome: StepOutcome
    detail: str = ""
    output: str = ""
    exit_status: int | None = None
    unrecoverable: bool = False  # a restart cannot fix this: escalate, open the circuit
    next_action: str | None = None  # in words, for on-call
    backend: str | None = None  # a verify that passed: the backend found serving
    unreachable: tuple[str, ...] = ()  # nodes that did not answer (counted by the engine)
    # nodes whose mlx-medic could not serve the step as deployed (counted by the engine;
    # before any step acted, the run ends misconfigured)
    misconfigured: tuple[Misconfiguration, ...] = ()
    # A sweep: node -> (pid, start time) of what it found unkillable, for every node swept
    # (the gauge, and one journal event per process no earlier run found)
    unkillable: dict[str, list[tuple[int, float]]] | None = None
    # A sweep: the survivors it names (each with its node's reboot advice); the engine keeps
    # them in the run's context, so the run's end names them and an escalation carries it
    survivors: SurvivorVerdict | None = None


@dataclass(frozen=True)
class StartMarks:
    """Where the head stood just before a start: each service log's size (a site's start
    script: the lines it wrote come after) and the serve wrapper's count of failed starts
    (None: no record of the model yet)."""

    log_sizes: dict[str, int | None]
    failed_starts: int | None


def _not_settled() -> None:
    """A run without an engine (a test's) has nobody to tell."""


@dataclass
class RunContext:
    """What a step (and a playbook's re-check) may use; the engine makes one per run."""

    model: Model
    inventory: Inventory
    transport: NodeTransport
    run_id: int
    health: HealthCheck  # the full verdict: up, down, or could not tell
    log: logging.Logger
    helpers: NodeHelpers | None = None  # None: built on `transport` (ssh.command_timeout)
    # Lets go of the run's model lock (the start step: the serve wrapper must take it).
    release_lock: Callable[[], Awaitable[None]] = _no_lock
    nodes: tuple[str, ...] = ()  # the nodes the run's alerts named (`node` label)
    # (node, pid, start time) of processes an earlier run found unkillable and named
    known_unkillable: frozenset[tuple[str, int, float]] = frozenset()
    # What survived this run's sweep (uninterruptible: only a reboot of its node ends it),
    # set by the engine from the sweep's result; None until a sweep found any
    survivors: SurvivorVerdict | None = None
    # Whether the model answered when the run's re-check ran (set by re-checks that probe
    # it): a verify of "still serving" judges only a model that was serving
    answered_before: bool | None = None
    # The head just before this run's last start (the start helper's reply): a verify
    # reads what that start did
    start_marks: StartMarks | None = None
    # The first step's read-only question, asked while the run re-checked and took the
    # lock (Step.read_ahead); None once taken, or when nothing was asked ahead
    read_ahead: asyncio.Task[Any] | None = None
    # This replica, as the head's records name who acts (run_by): its host and pid
    host: str | None = None
    pid: int | None = None
    # The engine's journal (None: a test without one): a playbook that acts on a node
    # reads and sets the pauses of every model there and the other runs (reboot-node)
    journal: Journal | None = None
    # Set when a run of the model is queued to act after this one (ActiveRun.successor)
    successor: asyncio.Event | None = None
    # Says the run has looked at what its alerts report for the last time
    # (ActiveRun.settle): a later alert for the model gets a run of its own after this one
    settle: Callable[[], None] = _not_settled

    def __post_init__(self) -> None:
        if self.helpers is None:
            self.helpers = NodeHelpers(
                self.transport,
                self.inventory,
                timeout=self.inventory.ssh.command_timeout,
                caller=REMEDIATOR,
            )

    @property
    def node_helpers(self) -> NodeHelpers:
        assert self.helpers is not None
        return self.helpers

    def take_read_ahead(self) -> asyncio.Task[Any] | None:
        """The answer asked ahead, once: a step that asks again later asks anew."""
        task, self.read_ahead = self.read_ahead, None
        return task

    @property
    def by(self) -> str:
        """Who acts, as the head's records say it: `remediator run N (pid P on HOST)`."""
        return run_by(self.run_id, self.host, self.pid)


@dataclass(frozen=True, kw_only=True)
class Step(ABC):
    kind: ClassVar[StepKind] = StepKind.ACTION
    # Changes nothing on any node (the preflight): a run whose steps so far were all read
    # only has done nothing yet, spent no budget, and ends misconfigured, not escalated
    read_only: ClassVar[bool] = False
    fallback: bool = False  # reached only after an earlier verify failed

    @abstractmethod
    def describe(self) -> StepDescription:
        """Name, node, description, targets and (for one command) argv."""

    @abstractmethod
    async def run(self, context: RunContext) -> StepResult:
        """Do the step. Never called in a dry run."""

    def timeout(self, default: float) -> float:
        """How long the runner lets the step take (`default`: the model's start time and
        the SSH command timeout, plus a minute); a reboot waits for the node's boot."""
        return default

    def verifies(self) -> str:
        """What a verify step judges, in the words of a fallback's condition."""
        return f"`{self.describe().name}`"

    def read_ahead(self, context: RunContext) -> Coroutine[Any, Any, Any] | None:
        """A first step's question that changes nothing on any node, asked while the run
        re-checks and takes the lock, so its answer is there when the step starts (one
        round trip less before the start); None: nothing to ask ahead."""
        return None


def describe_plan(plan: Sequence[Step]) -> list[StepDescription]:
    """Each step's description, a fallback's with its condition: it runs only if the
    verify before it fails (the engine's control flow), so on-call never reads a dry
    run's plan as "all of this will happen"."""
    described, last_verify = [], None
    for step in plan:
        about = step.describe()
        if step.fallback and last_verify is not None:
            condition = f"only if {last_verify.verifies()} fails verification"
            about = replace(about, condition=condition)
        if step.kind is StepKind.VERIFY:
            last_verify = step
        described.append(about)
    return described
