"""The engine: decides what to do with each alert, and runs playbooks in the background.

`submit` only decides and queues (a few journal writes, no awaits in between, so
concurrent deliveries cannot interleave): Alertmanager retries slow receivers,
and a slow answer would turn into duplicate deliveries. The order of the rules
is the safety argument:

  (an alert that could not be read -> `reject`: journaled with its reason, INVALID)
  resolved -> journal, cancel a still-queued run of that alert
  unrouted alert name / unknown model -> journal, ignore
  same firing (fingerprint, startsAt) held by a run, durably -> DUPLICATE
  older than max_alert_age -> STALE
  a run for the model queued or running -> ABSORBED (single flight), except that a
    new run is queued after it (through the rules below) for a model-down alert while
    the run acts on a serving model (sweep-orphans), and for an alert naming a node
    the run does not act on (sweep-orphans acts on the nodes named before it started)
  paused / circuit open -> PAUSED / CIRCUIT_OPEN
  budget spent -> escalate, CIRCUIT_OPEN (a playbook with a budget of its own, such as
    sweep-orphans: BACKOFF, no escalation); within backoff -> BACKOFF
  else -> a new run, STARTED

Dedupe exists to stop repeats of a firing whose run is queued or running, or whose run
succeeded (a dry run: planned). A firing is held by the run it started or joined, and
only while that run is in flight or after it succeeded. Every other ending (locked,
unreachable, inconclusive, skipped, escalated, failed, interrupted, cancelled) did not
fix the model, so it lets go of its firings (`Journal.end_run`): Alertmanager's next
notification of the same firing starts a new run, within the budget and backoff; a
PAUSED, CIRCUIT_OPEN or BACKOFF decision never holds a firing at all. So after
`mlx-medic resume`, the next re-notification acts.

Nothing acts unrecorded: every decision that acts is journaled before it acts, and a
journal write that fails (JournalError) ends the delivery: the web layer answers 503,
which Alertmanager retries. `journal_problem` says when the journal cannot record.

A run then asks its playbook whether the alert still holds (`recover`: is the model
still down? "could not tell" is not down), takes the model lock on the head node
(waiting up to `lock_wait` for a holder such as a serve wrapper starting its ranks, then
asking the playbook again, since that holder may have fixed it), and walks the
playbook's plan of steps, journaling each step before it starts. A node that does not
answer over SSH while the run re-checks or takes the lock ends it `unreachable` (never
`locked`): a warning, `mlx_medic_node_unreachable_total`, and the next action in words.
The engine owns the control flow: fallback steps only after a failed verify, a verify
that could not tell ends the run inconclusive, and a step that failed or found a state
a restart cannot fix escalates to a person. What a sweep could not end (uninterruptible
sleep: only a reboot of its node ends it) is no such state: the sweep's step ends ok, the
engine keeps its survivors in the run's context, sets `mlx_medic_unkillable_processes`
and journals one `unkillable` event (with the node's reboot advice) per process no earlier
run found, and the run goes on to start and verify. A verified run ends `succeeded`
naming the survivors left; an escalation of a run that met any carries their reboot
advice (after a failed verify, a survivor holding the model's port makes "reboot NODE"
the next action).

The engine is given its playbooks as instances by name (`builtin_playbooks()` unless
told otherwise); the config routes alert names to those names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mlx_medic.inventory import Inventory, Model
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.node.client import HelperCallError, NodeHelpers
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition, InvalidAlert
from mlx_medic.remediator.budget import Budget, Escalator, resume_hint
from mlx_medic.remediator.config import RemediatorConfig, check_routing
from mlx_medic.remediator.journal import Journal, JournalError, RunView, owner_tag
from mlx_medic.remediator.model_health import HealthVerdict, probe_model_health, remediator_node
from mlx_medic.remediator.outcomes import (
    RUN_HOLDS_FIRING,
    EscalationReason,
    RunOutcome,
    StepOutcome,
)
from mlx_medic.remediator.playbooks import FINISH_STOP, Playbook, builtin_playbooks
from mlx_medic.remediator.playbooks.finish_stop import read_stop_record
from mlx_medic.remediator.steps import (
    REMEDIATOR_RUN,
    HealthCheck,
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
)
from mlx_medic.remediator.steps.sweep import survivor_escalation
from mlx_medic.survivors import SurvivorVerdict, reboot_advice
from mlx_medic.transport import NodeTransport, TransportError

log = logging.getLogger("mlx_medic.remediator.engine")

UNKILLABLE_DATA = "processes: "  # in an `unkillable` event, before its JSON
SWEEP_WHILE_UP = "a model-down alert waits for the sweep of a serving model, then acts"
NODES_FIXED = "that run acts only on the nodes it started with"

SEEN_CACHE = 100_000
FLUSH_DELAY = 0.05
# The storm's repeats: journaled in batches (see Journal.flush); every other decision
# is on disk before submit returns.
_DEFERRED = {Disposition.DUPLICATE, Disposition.ABSORBED}
# Run endings worth a warning: nothing was fixed and the reason is not another holder.
_WARN = {RunOutcome.UNREACHABLE, RunOutcome.INCONCLUSIVE, RunOutcome.FAILED, RunOutcome.INTERRUPTED}


@dataclass
class _Run:
    run_id: int
    model: str
    playbook: Playbook
    dry_run: bool
    trigger: str  # 'alert' | 'manual'
    fingerprints: set[str] = field(default_factory=set)
    phase: str = "queued"  # queued -> starting (taking the lock) -> executing
    cancelled: bool = False
    ended: bool = False
    task: asyncio.Task[None] | None = None
    firings: set[tuple[str, str]] = field(default_factory=set)  # dedupe keys it holds
    nodes: set[str] = field(default_factory=set)  # the nodes its alerts named; empty: all
    nodes_fixed: bool = False  # its steps were given `nodes`: later ones are not acted on
    after: asyncio.Task[None] | None = None  # the run of the model it waits for, if any

    def covers(self, named: set[str]) -> bool:
        """Whether the run acts on the nodes an alert names (empty: every node), so the
        alert may join it: a playbook acting on every node, a run that has not fixed its
        nodes yet, or one whose nodes include them."""
        if not self.playbook.per_node or not self.nodes_fixed:
            return True
        return not self.nodes or (bool(named) and named <= self.nodes)

    def join(self, named: set[str]) -> None:
        """Add an alert's nodes to a run that has not fixed them (empty stays: every node)."""
        if not self.nodes_fixed and self.nodes:
            self.nodes = self.nodes | named if named else set()


class _End(NamedTuple):
    """How a run ended, as journaled: outcome, why, and the next action for on-call."""

    outcome: RunOutcome
    detail: str
    next_action: str | None = None


class Engine:
    def __init__(
        self,
        config: RemediatorConfig,
        inventory: Inventory,
        journal: Journal,
        transport: NodeTransport,
        *,
        playbooks: Mapping[str, Playbook] | None = None,
        health_check: HealthCheck | None = None,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        hostname: str | None = None,
        lock_lease: float = 90.0,
    ):
        """`playbooks`: name -> instance, the names `config.routing` may use (the
        built-in ones by default); a routed name it lacks is a ConfigError."""
        self.playbooks = dict(builtin_playbooks() if playbooks is None else playbooks)
        check_routing(config.routing, self.playbooks)
        self.config = config
        self.inventory = inventory
        self.this_node = remediator_node(config.node, inventory)
        self.journal = journal
        self.transport = transport
        self.clock = clock
        self.hostname = hostname or socket.gethostname()
        self.owner = owner_tag(self.hostname)
        self._health_check = health_check
        self.helpers = NodeHelpers(transport, inventory, timeout=inventory.ssh.command_timeout)
        self.locks = ModelLocks(
            inventory,
            transport,
            this_node=self.this_node,
            hostname=self.hostname,
            clock=clock,
            lease=lock_lease,
        )
        self.budget = Budget(journal, clock)
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._closing = False
        self._flush_handle: asyncio.TimerHandle | None = None
        self._journal_failing: str | None = None  # the problem last reported, for the log
        self._unjournaled_ends: list[tuple[int, RunOutcome, float, str, str | None]] = []

        self.m_remediations = Counter(
            "mlx_medic_remediations_total",
            "Remediation runs by final outcome.",
            ["model", "outcome"],
            registry=registry,
        )
        self.m_duration = Histogram(
            "mlx_medic_remediation_duration_seconds",
            "Wall time of remediation runs.",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=registry,
        )
        self.m_in_progress = Gauge(
            "mlx_medic_remediation_in_progress",
            "1 while a run acts on the model.",
            ["model"],
            registry=registry,
        )
        self.m_last_verified_backend = Gauge(
            "mlx_medic_last_verified_backend",
            "1 for the backend the last remediation run verified the model serving on,"
            " 0 for its other backends (all 0 until a run verified one).",
            ["model", "backend"],
            registry=registry,
        )
        self.m_escalations = Counter(
            "mlx_medic_escalations_total",
            "Escalations to a person that opened the model's circuit, by reason (a playbook"
            " with its own budget, such as sweep-orphans, pages through its own alert).",
            ["model", "reason"],
            registry=registry,
        )
        self.m_unreachable = Counter(
            "mlx_medic_node_unreachable_total",
            "Times a node the remediator needed for a model did not answer over SSH: taking"
            " or checking the model lock, the re-check on the head, the start-up check of a"
            " crashed run's lock (nothing was done then), or a playbook step's node helper"
            " (the run then escalated).",
            ["model", "node"],
            registry=registry,
        )
        self.m_unkillable = Gauge(
            "mlx_medic_unkillable_processes",
            "Processes of the model that the remediator's last sweep of the node found"
            " unkillable (uninterruptible sleep survives SIGKILL; only a reboot of the node"
            " clears them and the protection domains they hold; the run goes on around"
            " them).",
            ["model", "node"],
            registry=registry,
        )
        for model in inventory.models:
            self.m_in_progress.labels(model=model.name).set(0)
            for node_name in model.nodes:
                self.m_unkillable.labels(model=model.name, node=node_name).set(0)
            for backend, _spec in model.backends.in_order():
                self.m_last_verified_backend.labels(model=model.name, backend=backend).set(0)
        self.escalator = Escalator(
            journal,
            self.m_escalations,
            notify_url=config.notify_url,
            hostname=self.hostname,
            clock=clock,
        )

    # --- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Mark what a dead process left in flight, and release the locks those runs held."""
        now = self.clock()
        ended: list[RunView] = []
        for run_id in self.journal.mark_interrupted(now, hostname=self.hostname):
            run = self.journal.get_run(run_id)
            self.journal.add_event(
                "interrupted",
                now=now,
                model=run.model if run else None,
                run_id=run_id,
                detail="found in flight at start-up; its process is gone",
            )
            log.warning("run %s was interrupted by a crash", run_id)
            if run is not None and run.model in {m.name for m in self.inventory.models}:
                ended.append(run)

        async def release(run: RunView) -> None:
            model = self.inventory.model(run.model)
            host, _, pid = run.owner.rpartition(":")
            try:
                info = await asyncio.wait_for(
                    self.locks.release_of_ended_run(model.name, str(run.id), host, int(pid)),
                    self.inventory.ssh.connect_timeout + 10,
                )
            except (TransportError, TimeoutError) as exc:
                detail = (
                    f"could not check the lock of interrupted run {run.id} on"
                    f" {model.head} at start-up: {exc or 'no answer'}; a lock it left"
                    " there is broken by the next run that finds its holder gone or"
                    " its lease run out"
                )
                log.warning(
                    "start-up lock check failed: %s",
                    detail,
                    extra={"model": model.name, "node": model.head},
                )
                self.m_unreachable.labels(model=model.name, node=model.head).inc()
                self.journal.add_event(
                    "lock_check_failed",
                    now=self.clock(),
                    model=model.name,
                    detail=detail,
                )
                return
            if info is not None:
                self.journal.add_event(
                    "lock_released",
                    now=self.clock(),
                    model=model.name,
                    detail=f"released a stale lock of dead pid {info.pid} (run {info.run_id})",
                )

        await asyncio.gather(*(release(run) for run in ended))
        await self._finish_left_stopped(ended)

    async def _finish_left_stopped(self, interrupted: list[RunView]) -> None:
        """A service an interrupted run stopped and never started again (this process died
        between its stop and its start): queue `finish-stop` for it, which sweeps before it
        starts. A stop by anyone else (a person, another run), or on a paused model or one
        whose circuit is open, is journaled and left to a person."""
        playbook = self.playbooks.get(FINISH_STOP)
        if playbook is None:
            return
        ours = {run.model: f"{REMEDIATOR_RUN}{run.id}" for run in interrupted}

        async def check(model: Model) -> None:
            try:
                record = await read_stop_record(self.helpers, model)
            except HelperCallError as exc:
                if exc.unreachable:
                    self.m_unreachable.labels(model=model.name, node=model.head).inc()
                self.journal.add_event(
                    "service_check_failed",
                    now=self.clock(),
                    model=model.name,
                    detail=f"could not read whether a run left {model.service.label} stopped"
                    f" on {model.head} at start-up: {exc}",
                )
                return
            if record is None:
                return
            said = f"{model.service.label} on {model.head} was left stopped by {record.by}"
            control = self.journal.blocking_control(model.name)
            if record.by != ours[model.name] or control is not None:
                why = (
                    f"not by {ours[model.name]}, which was interrupted"
                    if control is None
                    else "the model is paused"
                    if control.kind == "pause"
                    else "the model's circuit is open"
                )
                self.journal.add_event(
                    "service_left_stopped",
                    now=self.clock(),
                    model=model.name,
                    detail=f"{said} ({record.reason}); {why}: left stopped for a person to"
                    f" start (`mlx-medic remediate {model.name}` sweeps first)",
                )
                log.warning("%s; left stopped (%s)", said, why, extra={"model": model.name})
                return
            run_id = self.journal.create_run(
                model=model.name,
                playbook=FINISH_STOP,
                trigger_kind="startup",
                owner=self.owner,
                now=self.clock(),
            )
            self.journal.add_event(
                "service_left_stopped",
                now=self.clock(),
                model=model.name,
                run_id=run_id,
                detail=f"{said} ({record.reason}); run {run_id} sweeps every node, then starts it",
            )
            log.warning("%s; run %s finishes its work", said, run_id, extra={"model": model.name})
            run = _Run(run_id, model.name, playbook, False, "startup")
            self._runs[model.name] = run  # start-up: no other run of the model yet
            self._spawn(run)

        await asyncio.gather(*(check(self.inventory.model(name)) for name in ours))

    async def close(self) -> None:
        """Cancel runs in flight (journaled as interrupted, locks released)."""
        self._closing = True
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.escalator.drain(timeout=2.0)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no run is queued or running (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._tasks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("runs still in flight")
            await asyncio.wait(set(self._tasks), timeout=remaining)

    # --- decisions --------------------------------------------------------

    def _event(
        self,
        disposition: Disposition | str,
        event: AlertEvent | None,
        *,
        model: str | None = None,
        run_id: int | None = None,
        detail: str = "",
        fingerprint: str | None = None,
    ) -> None:
        self.journal.add_event(
            str(disposition),
            now=self.clock(),
            model=model,
            fingerprint=event.fingerprint if event else fingerprint,
            run_id=run_id,
            detail=detail,
            defer=disposition in _DEFERRED,
        )
        if self.journal.pending:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Deferred journal writes reach the file within FLUSH_DELAY (other processes
        read it); readers in this process see them at once (reads flush first)."""
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        try:
            self.journal.flush()
        except Exception:
            log.exception("journal flush failed")

    def journal_problem(self) -> str | None:
        """None when the journal records; else why not, and nothing may act. After a
        failed write one real write decides (the event saying it records again), so a
        freed disk is noticed by the next delivery; run ends it refused meanwhile are
        written then too. A file removed or replaced stays a problem: no write can fix it."""
        problem = self.journal.problem()
        if problem is None or problem == self.journal.write_failure:
            was = problem or self._journal_failing
            if was is not None or self._unjournaled_ends:
                with contextlib.suppress(JournalError):
                    if was is not None:
                        self.journal.add_event(
                            "journal_recovered",
                            now=self.clock(),
                            detail=f"the journal records again; it had failed: {was}",
                        )
                    self._journal_ends()
                problem = self.journal.problem()
        if problem != self._journal_failing:
            if problem is None:
                log.warning("the journal records again")
            else:
                log.error("the journal cannot record, nothing acts until it can: %s", problem)
            self._journal_failing = problem
        return problem

    def _journal_ends(self) -> None:
        """Write the run ends a failing journal refused (JournalError if it still does)."""
        while self._unjournaled_ends:
            self.journal.end_run(*self._unjournaled_ends[0])
            self._unjournaled_ends.pop(0)

    def reject(self, invalid: InvalidAlert) -> Disposition:
        """Journal an alert that could not be read, with its reason; nothing acts on it."""
        named = invalid.model if self._known_model(invalid.model or None) else None
        parts = []
        if invalid.alertname:
            parts.append(f"alert {invalid.alertname[:100]!r}")
        if invalid.model and named is None:
            parts.append(f"model={invalid.model[:100]!r}")
        what = " ".join(parts) or "an alert"
        self._event(
            Disposition.INVALID,
            None,
            model=named,
            fingerprint=invalid.fingerprint[:128] or None,
            detail=f"{what} is not acted on: {invalid.reason}",
        )
        return Disposition.INVALID

    def _remember(self, key: tuple[str, str]) -> None:
        self._seen[key] = None
        if len(self._seen) > SEEN_CACHE:
            self._seen.popitem(last=False)

    async def submit(self, event: AlertEvent) -> Disposition:
        """Decide, journal, maybe queue a run. Never runs a playbook inline."""
        label = self.config.routing.model_label
        model_name = event.labels.get(label)
        model = self._known_model(model_name)

        if event.status == AlertStatus.RESOLVED:
            detail = f"{event.alertname} resolved"
            run = self._runs.get(model.name) if model else None
            if run is not None and not run.ended and event.fingerprint in run.fingerprints:
                run.fingerprints.discard(event.fingerprint)
                if run.phase == "queued" and not run.fingerprints:
                    why = f"alert {event.fingerprint} resolved before the run started"
                    self._cancel_queued(run, why)
                    detail += f"; cancelled queued run {run.run_id}"
                elif run.phase == "queued":
                    detail += f"; run {run.run_id} stays queued for its other firing alerts"
            self._event(
                Disposition.RESOLVED, event, model=model.name if model else None, detail=detail
            )
            return Disposition.RESOLVED

        playbook_name = self.config.routing.playbooks.get(event.alertname)
        if playbook_name is None:
            self._event(
                Disposition.UNROUTED,
                event,
                detail=f"no playbook for alert {event.alertname[:100]!r}",
            )
            return Disposition.UNROUTED
        if model is None:
            shown = "missing" if model_name is None else repr(model_name[:100])
            self._event(
                Disposition.UNKNOWN_MODEL,
                event,
                detail=f"label {label}={shown} names no model in the inventory",
            )
            return Disposition.UNKNOWN_MODEL

        key = event.dedupe_key
        if key in self._seen or self.journal.firing_seen(*key):
            self._remember(key)
            self._event(
                Disposition.DUPLICATE,
                event,
                model=model.name,
                detail=f"firing since {key[1]} already handled",
            )
            return Disposition.DUPLICATE

        age = self.clock() - event.starts_at.timestamp()
        if age > self.config.max_alert_age:
            self._event(
                Disposition.STALE,
                event,
                model=model.name,
                detail=f"alert is {age / 3600:.1f}h old (max_alert_age"
                f" {self.config.max_alert_age / 3600:g}h): not acting on old news",
            )
            return Disposition.STALE

        playbook = self.playbooks[playbook_name]
        node_label = event.labels.get("node")
        named = {node_label} if node_label in model.nodes else set()
        current = self._runs.get(model.name)
        # A model that is down is not absorbed by a run that acts on it while it serves,
        # nor an alert naming a node the run will not act on: its run is queued after it.
        waits_for, why_after = None, ""
        if current is not None and not current.ended:
            if current.playbook.while_up and not playbook.while_up:
                waits_for, why_after = current, SWEEP_WHILE_UP
            elif not current.covers(named):
                waits_for, why_after = current, NODES_FIXED
            if waits_for is not None:
                current = None
        if current is not None and not current.ended:
            current.join(named)
            self.journal.record_firing(*key, model.name, current.run_id, self.clock(), defer=True)
            self._remember(key)
            current.fingerprints.add(event.fingerprint)
            current.firings.add(key)
            self._event(
                Disposition.ABSORBED,
                event,
                model=model.name,
                run_id=current.run_id,
                detail=f"run {current.run_id} is already {current.phase}",
            )
            return Disposition.ABSORBED

        control = self.journal.blocking_control(model.name)
        if control is not None:
            paused = control.kind == "pause"
            disposition = Disposition.PAUSED if paused else Disposition.CIRCUIT_OPEN
            scope = "all models" if control.model is None else model.name
            self._event(
                disposition,
                event,
                model=model.name,
                detail=f"{control.kind} on {scope} since"
                f" {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(control.since))}:"
                f" {control.reason}".rstrip(": "),
            )
            return disposition

        dry_run = self.config.dry_run
        if not dry_run:
            own = [name for name, p in self.playbooks.items() if p.own_budget]
            decision = (
                self.budget.check(model, playbook=playbook_name)
                if playbook.own_budget
                else self.budget.check(model, exclude=own)
            )
            if decision.spent and playbook.own_budget:  # never opens recover's circuit
                self._event(
                    Disposition.BACKOFF,
                    event,
                    model=model.name,
                    detail=f"{playbook_name}: {decision.reason}",
                )
                return Disposition.BACKOFF
            if decision.spent:
                self.escalator.escalate(
                    model.name,
                    EscalationReason.BUDGET_SPENT,
                    decision.reason,
                    f"find out why {model.name} keeps failing (`mlx-medic log --model"
                    f" {model.name}`) and fix it; {resume_hint(model.name)}",
                )
                self._event(
                    Disposition.CIRCUIT_OPEN, event, model=model.name, detail=decision.reason
                )
                return Disposition.CIRCUIT_OPEN
            if not decision.allowed:
                self._event(Disposition.BACKOFF, event, model=model.name, detail=decision.reason)
                return Disposition.BACKOFF

        run_id = self.journal.create_alert_run(
            model=model.name,
            playbook=playbook_name,
            owner=self.owner,
            now=self.clock(),
            alertname=event.alertname,
            fingerprint=event.fingerprint,
            starts_at=key[1],
            labels=dict(event.labels),
            dry_run=dry_run,
        )
        self._remember(key)
        if run_id is None:  # another process recorded this firing first
            self._event(
                Disposition.DUPLICATE,
                event,
                model=model.name,
                detail="firing recorded by another process",
            )
            return Disposition.DUPLICATE
        run = _Run(
            run_id,
            model.name,
            playbook,
            dry_run,
            "alert",
            {event.fingerprint},
            firings={key},
            nodes=named,
            after=waits_for.task if waits_for is not None else None,
        )
        self._runs[model.name] = run
        self._spawn(run)
        self._event(
            Disposition.STARTED,
            event,
            model=model.name,
            run_id=run_id,
            detail=f"run {run_id} queued ({playbook_name}{', dry run' if dry_run else ''})"
            + (f" after run {waits_for.run_id} ({why_after})" if waits_for else ""),
        )
        return Disposition.STARTED

    def _known_model(self, name: str | None) -> Model | None:
        if name is None:
            return None
        try:
            return self.inventory.model(name)
        except KeyError:
            return None

    def _spawn(self, run: _Run) -> None:
        task = asyncio.get_running_loop().create_task(self._execute(run))
        run.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_queued(self, run: _Run, why: str) -> None:
        run.cancelled = True
        self._finish(run, _End(RunOutcome.CANCELLED, why))
        if run.task is not None:
            run.task.cancel()

    def _finish(self, run: _Run, end: _End) -> None:
        """Journal the end of a run once, count it, free the model's slot. An ending that
        does not hold its firings lets them go (see the module's dedupe rule). An end
        the journal refuses is kept and written once it records again."""
        if run.ended:
            return
        run.ended = True
        now = self.clock()
        outcome, detail, next_action = end
        try:
            self._journal_ends()
            self.journal.end_run(run.run_id, outcome, now, detail, next_action)
        except JournalError as exc:
            log.error(
                "could not journal the end of run %s (%s): %s",
                run.run_id,
                outcome,
                exc,
                extra={"model": run.model, "run_id": run.run_id},
            )
            self._unjournaled_ends.append((run.run_id, outcome, now, detail, next_action))
        if outcome not in RUN_HOLDS_FIRING:
            for key in run.firings:
                self._seen.pop(key, None)
        self.m_remediations.labels(model=run.model, outcome=outcome).inc()
        with contextlib.suppress(Exception):
            view = self.journal.get_run(run.run_id)
            if view is not None and view.started_at is not None:
                self.m_duration.observe(max(0.0, now - view.started_at))
        if self._runs.get(run.model) is run:
            del self._runs[run.model]
        log.log(
            logging.WARNING if outcome in _WARN else logging.INFO,
            "run %s of %s ended: %s",
            run.run_id,
            run.model,
            outcome,
            extra={
                "model": run.model,
                "run_id": run.run_id,
                "outcome": outcome,
                "detail": detail,
                "next_action": next_action,
            },
        )

    # --- runs -------------------------------------------------------------

    async def run_manual(self, model_name: str, *, dry_run: bool) -> int:
        """Run the model's playbook now, by hand: same lock, same journal; no re-check,
        budget, pause or circuit (a person decided). Returns the run id once it has ended."""
        try:
            model = self.inventory.model(model_name)
        except KeyError:
            known = ", ".join(m.name for m in self.inventory.models) or "none"
            raise KeyError(f"no model {model_name!r} in the inventory (known: {known})") from None
        playbook_name = self.config.routing.playbooks.get("LLMModelDown", "recover")
        if playbook_name not in self.playbooks:
            raise KeyError(f"no playbook {playbook_name!r} (playbooks: {sorted(self.playbooks)})")
        run_id = self.journal.create_run(
            model=model.name,
            playbook=playbook_name,
            trigger_kind="manual",
            owner=self.owner,
            now=self.clock(),
            dry_run=dry_run,
        )
        run = _Run(run_id, model.name, self.playbooks[playbook_name], dry_run, "manual")
        self._runs.setdefault(model.name, run)
        self._spawn(run)
        assert run.task is not None
        await asyncio.shield(run.task)
        return run_id

    async def _health(self, model: Model) -> HealthVerdict:
        """The model's health verdict; a probe that broke could not tell."""
        try:
            if self._health_check is not None:
                return await self._health_check(model)
            return await probe_model_health(
                model,
                self.inventory,
                transport=self.transport,
                probe_from=self.config.probe_from,
                this_node=self.this_node,
            )
        except Exception as exc:
            log.warning("health check of %s failed: %s", model.name, exc)
            return HealthVerdict.unknown(f"health check raised {type(exc).__name__}: {exc}")

    async def _execute(self, run: _Run) -> None:
        """One run from queue to end. The lock is released before the run is marked
        ended, so the next run of the model never finds our own lock still there."""
        model = self.inventory.model(run.model)
        holding: list[LockHandle] = []
        end: _End | None = None
        try:
            if run.after is not None:  # a run that acts while the model serves goes first
                await asyncio.wait({run.after})
            end = await self._attempt(run, model, holding)
        except asyncio.CancelledError:
            if not run.ended:
                self._interrupt_steps(run)
                end = _End(RunOutcome.INTERRUPTED, "the remediator stopped during this run")
            raise
        except Exception as exc:
            log.exception("run %s of %s crashed", run.run_id, model.name)
            self._interrupt_steps(run)
            end = _End(RunOutcome.FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.m_in_progress.labels(model=model.name).set(0)
            for handle in holding:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.locks.release(handle))
            if end is not None:
                self._finish(run, end)

    async def _attempt(self, run: _Run, model: Model, holding: list[LockHandle]) -> _End:
        """Re-check (the playbook's), lock, walk the plan."""

        async def release_lock() -> None:
            """The start step lets go of the lock, so the wrapper it starts can take it."""
            while holding:
                await asyncio.shield(self.locks.release(holding.pop()))

        run.nodes_fixed = True
        context = RunContext(
            model=model,
            inventory=self.inventory,
            transport=self.transport,
            run_id=run.run_id,
            health=self._health,
            log=log,
            helpers=self.helpers,
            release_lock=release_lock,
            nodes=tuple(n for n in model.nodes if n in run.nodes),
            known_unkillable=self._known_unkillable(model.name),
        )
        alert = run.trigger in ("alert", "startup")  # both re-check before they act
        if alert:
            control = self.journal.blocking_control(model.name)
            if control is not None:
                return _End(RunOutcome.SKIPPED, f"{control.kind} set before the run started")
            skipped = await self._recheck(run, model, context)
            if skipped is not None:
                return skipped
        holder = "manual" if run.trigger == "manual" else "remediator"
        run.phase = "starting"  # no longer cancellable: a half-taken lock must not leak
        # A person waits at a terminal for a manual run: it never waits for the lock.
        handle = await self.locks.acquire(
            model.name, holder, str(run.run_id), wait=self.config.lock_wait if alert else 0.0
        )
        if handle is None:
            why = self.locks.refusals.get(model.name, "locked")
            silent = self.locks.unreachable.get(model.name)
            if silent is not None:
                return self._unreachable(model, silent, f"taking the model lock: {why}")
            return _End(RunOutcome.LOCKED, why if why.startswith("locked") else f"locked: {why}")
        holding.append(handle)
        if alert and handle.waited > 0:  # the holder (a serve wrapper?) may have fixed it
            skipped = await self._recheck(run, model, context)
            if skipped is not None:
                return skipped
        run.phase = "executing"
        self.journal.start_run(run.run_id, self.clock())
        self.m_in_progress.labels(model=model.name).set(1)
        return await self._walk(run, model, context)

    async def _recheck(self, run: _Run, model: Model, context: RunContext) -> _End | None:
        """The playbook's re-check: None to act, else how the run ends."""
        verdict = await run.playbook.recheck(context)
        if verdict.should_act:
            log.info(
                "run %s of %s acts: %s",
                run.run_id,
                model.name,
                verdict.reason,
                extra={"model": model.name, "run_id": run.run_id},
            )
            return None
        if verdict.unreachable_node is not None:
            return self._unreachable(model, verdict.unreachable_node, f"re-check: {verdict.reason}")
        if not verdict.undecided:
            self._event(
                Disposition.STALE, None, model=model.name, run_id=run.run_id, detail=verdict.reason
            )
        return _End(RunOutcome.SKIPPED, verdict.reason)

    def _unreachable(self, model: Model, node_name: str, detail: str) -> _End:
        """A node the run needed did not answer: nothing was done; say what to check."""
        self.m_unreachable.labels(model=model.name, node=node_name).inc()
        node = self.inventory.node(node_name)
        return _End(
            RunOutcome.UNREACHABLE,
            f"{node_name} did not answer over SSH ({detail})",
            f"nothing was done to {model.name}: check that {node_name} is up and answers SSH"
            f" (`ssh -p {node.port} {node.user}@{node.ssh} true`) and that"
            f" {self.inventory.state_dir / 'locks'} there is writable; the next notification"
            f" of the alert starts a new run, or run `mlx-medic remediate {model.name}`",
        )

    def _interrupt_steps(self, run: _Run) -> None:
        with contextlib.suppress(JournalError):  # a failing journal: start-up marks them
            view = self.journal.get_run(run.run_id)
            for step in view.steps if view else []:
                if step.outcome == StepOutcome.RUNNING:
                    self.journal.end_step(
                        step.id,
                        StepOutcome.INTERRUPTED,
                        self.clock(),
                        detail="the run stopped while this step ran",
                    )

    async def _walk(self, run: _Run, model: Model, context: RunContext) -> _End:
        """Walk the plan: each step journaled before it starts, its result deciding what
        comes next."""
        plan = run.playbook.plan_for(model, self.inventory, context.nodes)
        if not plan:
            return _End(RunOutcome.FAILED, "the playbook planned no steps")
        described = [step.describe() for step in plan]
        if run.dry_run:
            for seq, about in enumerate(described, 1):
                self._begin_step(run, seq, about, outcome=StepOutcome.PLANNED)
            return _End(RunOutcome.PLANNED, f"dry run: {len(plan)} steps planned, nothing executed")

        self.journal.mark_counted(run.run_id)
        step_timeout = max(model.policy.start_timeout, self.inventory.ssh.command_timeout) + 60
        verify_failed = False
        done: list[str] = []  # steps that did their part: an escalation names them
        for seq, (step, about) in enumerate(zip(plan, described, strict=True), 1):
            if step.fallback and not verify_failed:
                continue
            step_id = self._begin_step(run, seq, about)
            result = await self._run_step(run.run_id, step, about, context, step_timeout)
            self.journal.end_step(
                step_id,
                result.outcome,
                self.clock(),
                exit_status=result.exit_status,
                output=result.output,
                detail=result.detail,
            )
            where = f"{about.name} on {about.node}"
            for node_name in result.unreachable:
                self.m_unreachable.labels(model=model.name, node=node_name).inc()
            if result.survivors is not None:
                context.survivors = _merged(context.survivors, result.survivors)
            if result.unkillable is not None:
                self._record_unkillable(run, model, result, context)
            if result.unrecoverable:
                detail = result.detail or f"{where} found a state a restart cannot fix"
                action = result.next_action or f"recover {model.name} by hand"
                return self._escalate(
                    run,
                    EscalationReason.UNRECOVERABLE,
                    detail,
                    action,
                    context,
                    after_start=verify_failed,
                )
            if result.outcome == StepOutcome.INCONCLUSIVE:
                return _End(
                    RunOutcome.INCONCLUSIVE,
                    f"step {where}: {result.detail}",
                    f"find out by hand whether {model.name} serves on {model.head}"
                    f" ({model.host}:{model.port}); the run: `mlx-medic log --model {model.name}`",
                )
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.OK:
                self._verified(model, result.backend)
                on = f" on {result.backend}" if result.backend else ""
                left = context.survivors
                said = (
                    f"; survivors left: {left.describe(self.inventory)}"
                    if left is not None and left.survivors
                    else ""
                )
                return _End(RunOutcome.SUCCEEDED, f"{model.name} verified healthy{on}{said}")
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.FAILED:
                verify_failed = True
                continue
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.SKIPPED:
                # a "still serving" check of a model that was not serving: the steps before
                # it did their work, the model is LLMModelDown's (sweep-orphans)
                swept = f"{', '.join(done)} done; " if done else ""
                return _End(RunOutcome.SUCCEEDED, f"{swept}{result.detail}")
            if result.outcome in (StepOutcome.OK, StepOutcome.SKIPPED):
                done += [where] if result.outcome == StepOutcome.OK else []
                continue
            ended = "failed" if result.outcome == StepOutcome.FAILED else f"ended {result.outcome}"
            detail = f"step {where} {ended}: {result.detail}".rstrip(": ")
            action = (
                f"read the step's output (`mlx-medic log --model {model.name}`), recover by hand"
            )
            return self._escalate(
                run,
                EscalationReason.STEP_FAILED,
                detail,
                action,
                context,
                after_start=verify_failed,
            )
        ended = "the playbook ended without a verified start"
        if verify_failed:
            ended = f"{model.name} did not answer" + (f" after {', '.join(done)}" if done else "")
        return self._escalate(
            run,
            EscalationReason.STEP_FAILED,
            ended,
            f"recover {model.name} by hand",
            context,
            after_start=verify_failed,
        )

    async def _run_step(
        self,
        run_id: int,
        step: Step,
        about: StepDescription,
        context: RunContext,
        timeout: float,
    ) -> StepResult:
        """The step's own result; a step that raised or overran has failed."""
        try:
            return await asyncio.wait_for(step.run(context), timeout)
        except TimeoutError:
            return StepResult(StepOutcome.FAILED, detail=f"no end after {timeout:g}s")
        except TransportError as exc:
            return StepResult(StepOutcome.FAILED, detail=str(exc))
        except Exception as exc:
            log.exception("step %s of run %s raised", about.name, run_id)
            return StepResult(StepOutcome.FAILED, detail=f"{type(exc).__name__}: {exc}")

    def _verified(self, model: Model, backend: str | None) -> None:
        if backend is None:
            return
        for name, _spec in model.backends.in_order():
            self.m_last_verified_backend.labels(model=model.name, backend=name).set(
                1 if name == backend else 0
            )

    def _escalate(
        self,
        run: _Run,
        reason: EscalationReason,
        detail: str,
        next_action: str,
        context: RunContext,
        *,
        after_start: bool,
    ) -> _End:
        """Tell on-call; open the model's circuit (and say how to close it) unless the
        playbook has its own budget. A run whose sweep left survivors names them and
        carries their reboot advice (after a failed verify, a survivor holding the port
        makes its reboot the next action: `survivor_escalation`)."""
        detail, next_action = survivor_escalation(
            context.survivors, self.inventory, detail, next_action, after_start=after_start
        )
        opens = not run.playbook.own_budget
        if opens:
            next_action = f"{next_action}; {resume_hint(run.model)}"
        self.escalator.escalate(
            run.model, reason, detail, next_action, run_id=run.run_id, open_circuit=opens
        )
        return _End(RunOutcome.ESCALATED, detail, next_action)

    def _known_unkillable(self, model: str) -> frozenset[tuple[str, int, float]]:
        """(node, pid, start time) of every process a run of the model found unkillable
        and named (journal events `unkillable`), so later runs name it once."""
        found: set[tuple[str, int, float]] = set()
        for event in self.journal.list_events(model=model, kind="unkillable", limit=10_000):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                data = json.loads(event.detail.partition(UNKILLABLE_DATA)[2])
                found |= {
                    (data["node"], int(pid), float(start)) for pid, start in data["processes"]
                }
        return frozenset(found)

    def _record_unkillable(
        self, run: _Run, model: Model, result: StepResult, context: RunContext
    ) -> None:
        """A sweep's unkillable processes: the gauge per node swept, and a journal event
        (a warning, with the node's reboot advice) for those no earlier run found. Neither
        escalates: the sweep's step decided what they mean for the run, and the node's
        exporter pages for the reboot (MLXUnkillableSurvivors)."""
        assert result.unkillable is not None
        named = result.survivors.survivors if result.survivors is not None else []
        for node_name, processes in result.unkillable.items():
            self.m_unkillable.labels(model=model.name, node=node_name).set(len(processes))
            new = [p for p in processes if (node_name, *p) not in context.known_unkillable]
            if not new:
                continue
            data = json.dumps({"node": node_name, "processes": new})
            pids = ", ".join(str(pid) for pid, _ in new)
            placed = [m.name for m in self.inventory.models_on(node_name)]
            advice = reboot_advice(node_name, named, placed)
            self.journal.add_event(
                "unkillable",
                now=self.clock(),
                model=model.name,
                run_id=run.run_id,
                detail=f"{len(new)} process(es) on {node_name} survive SIGKILL (pids"
                f" {pids}); {advice}. {UNKILLABLE_DATA}{data}",
            )
            log.warning(
                "%s process(es) of %s on %s survive SIGKILL (pids %s); %s",
                len(new),
                model.name,
                node_name,
                pids,
                advice,
                extra={"model": model.name, "node": node_name, "run_id": run.run_id},
            )

    def _begin_step(
        self,
        run: _Run,
        seq: int,
        about: StepDescription,
        outcome: StepOutcome = StepOutcome.RUNNING,
    ) -> int:
        return self.journal.begin_step(
            run.run_id,
            seq=seq,
            name=about.name,
            node=about.node,
            command=about.argv,
            description=about.description,
            targets=list(about.targets),
            now=self.clock(),
            outcome=outcome,
        )


def _merged(found: SurvivorVerdict | None, more: SurvivorVerdict) -> SurvivorVerdict:
    """The survivors a run met so far, each once (a later sweep's word on one wins)."""
    if found is None:
        return more
    again = {s.identity for s in more.survivors}
    return SurvivorVerdict(
        more.model, [s for s in found.survivors if s.identity not in again] + more.survivors
    )
