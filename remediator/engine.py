"""The engine: decides what to do with each alert, and runs playbooks in the background.

`submit` only decides and queues (a few journal writes, no awaits in between, so
concurrent deliveries cannot interleave): Alertmanager retries slow receivers,
and a slow answer would turn into duplicate deliveries. The order of the rules
is the safety argument:

  resolved -> journal, cancel a still-queued run of that alert
  unrouted alert name / unknown model -> journal, ignore
  same firing (fingerprint, startsAt) seen before, durably -> DUPLICATE
  older than max_alert_age -> STALE
  a run for the model queued or running -> ABSORBED (single flight)
  paused / circuit open -> PAUSED / CIRCUIT_OPEN
  budget spent -> escalate, CIRCUIT_OPEN; within backoff -> BACKOFF
  else -> a new run, STARTED

A run then asks its playbook whether the alert still holds (`recover`: is the model
still down? "could not tell" is not down), takes the model lock on the head node, and
walks the playbook's plan of steps, journaling each step before it starts. The engine
owns the control flow: fallback steps only after a failed verify, a verify that could
not tell ends the run inconclusive, and a step that did nothing, failed, or found a
state a restart cannot fix escalates to a person.

The engine is given its playbooks as instances by name (`builtin_playbooks()` unless
told otherwise); the config routes alert names to those names.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition
from mlx_medic.remediator.budget import Budget, Escalator, resume_hint
from mlx_medic.remediator.config import RemediatorConfig, check_routing
from mlx_medic.remediator.journal import Journal, RunView, owner_tag
from mlx_medic.remediator.model_health import HealthVerdict, probe_model_health, remediator_node
from mlx_medic.remediator.outcomes import EscalationReason, RunOutcome, StepOutcome
from mlx_medic.remediator.playbooks import Playbook, builtin_playbooks
from mlx_medic.remediator.steps import (
    HealthCheck,
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
)
from mlx_medic.transport import NodeTransport, TransportError

log = logging.getLogger("mlx_medic.remediator.engine")

SEEN_CACHE = 100_000
FLUSH_DELAY = 0.05
# The storm's repeats: journaled in batches (see Journal.flush); every other decision
# is on disk before submit returns.
_DEFERRED = {Disposition.DUPLICATE, Disposition.ABSORBED}


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
    firing: tuple[str, str] | None = None


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
        self.locks = ModelLocks(
            inventory, transport, this_node=self.this_node, hostname=self.hostname, clock=clock,
            lease=lock_lease,
        )
        self.budget = Budget(journal, clock)
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._closing = False
        self._flush_handle: asyncio.TimerHandle | None = None

        self.m_remediations = Counter(
            "mlx_medic_remediations_total", "Remediation runs by final outcome.",
            ["model", "outcome"], registry=registry,
        )
        self.m_duration = Histogram(
            "mlx_medic_remediation_duration_seconds", "Wall time of remediation runs.",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600), registry=registry,
        )
        self.m_in_progress = Gauge(
            "mlx_medic_remediation_in_progress", "1 while a run acts on the model.",
            ["model"], registry=registry,
        )
        self.m_last_verified_backend = Gauge(
            "mlx_medic_last_verified_backend",
            "1 for the backend the last remediation run verified the model serving on,"
            " 0 for its other backends (all 0 until a run verified one).",
            ["model", "backend"], registry=registry,
        )
        self.m_escalations = Counter(
            "mlx_medic_escalations_total", "Escalations to a person, by reason.",
            ["model", "reason"], registry=registry,
        )
        for model in inventory.models:
            self.m_in_progress.labels(model=model.name).set(0)
            for backend, _spec in model.backends.in_order():
                self.m_last_verified_backend.labels(model=model.name, backend=backend).set(0)
        self.escalator = Escalator(
            journal, self.m_escalations, notify_url=config.notify_url,
            hostname=self.hostname, clock=clock,
        )

    # --- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Mark what a dead process left in flight, and release the locks those runs held."""
        now = self.clock()
        ended: list[RunView] = []
        for run_id in self.journal.mark_interrupted(now, hostname=self.hostname):
            run = self.journal.get_run(run_id)
            self.journal.add_event(
                "interrupted", now=now, model=run.model if run else None, run_id=run_id,
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
                self.journal.add_event(
                    "lock_check_failed", now=self.clock(), model=model.name,
                    detail=f"could not check the lock on {model.head} at start-up: {exc}",
                )
                return
            if info is not None:
                self.journal.add_event(
                    "lock_released", now=self.clock(), model=model.name,
                    detail=f"released a stale lock of dead pid {info.pid} (run {info.run_id})",
                )

        await asyncio.gather(*(release(run) for run in ended))

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
    ) -> None:
        self.journal.add_event(
            str(disposition), now=self.clock(), model=model,
            fingerprint=event.fingerprint if event else None, run_id=run_id, detail=detail,
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
                Disposition.UNROUTED, event,
                detail=f"no playbook for alert {event.alertname[:100]!r}",
            )
            return Disposition.UNROUTED
        if model is None:
            shown = "missing" if model_name is None else repr(model_name[:100])
            self._event(
                Disposition.UNKNOWN_MODEL, event,
                detail=f"label {label}={shown} names no model in the inventory",
            )
            return Disposition.UNKNOWN_MODEL

        key = event.dedupe_key
        if key in self._seen or self.journal.firing_seen(*key):
            self._remember(key)
            self._event(Disposition.DUPLICATE, event, model=model.name,
                        detail=f"firing since {key[1]} already handled")
            return Disposition.DUPLICATE

        age = self.clock() - event.starts_at.timestamp()
        if age > self.config.max_alert_age:
            self._event(
                Disposition.STALE, event, model=model.name,
                detail=f"alert is {age / 3600:.1f}h old (max_alert_age"
                f" {self.config.max_alert_age / 3600:g}h): not acting on old news",
            )
            return Disposition.STALE

        current = self._runs.get(model.name)
        if current is not None and not current.ended:
            self.journal.record_firing(*key, model.name, current.run_id, self.clock(), defer=True)
            self._remember(key)
            current.fingerprints.add(event.fingerprint)
            self._event(Disposition.ABSORBED, event, model=model.name, run_id=current.run_id,
                        detail=f"run {current.run_id} is already {current.phase}")
            return Disposition.ABSORBED

        control = self.journal.blocking_control(model.name)
        if control is not None:
            paused = control.kind == "pause"
            disposition = Disposition.PAUSED if paused else Disposition.CIRCUIT_OPEN
            scope = "all models" if control.model is None else model.name
            self._event(disposition, event, model=model.name,
                        detail=f"{control.kind} on {scope} since"
                        f" {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(control.since))}:"
                        f" {control.reason}".rstrip(": "))
            return disposition

        dry_run = self.config.dry_run
        if not dry_run:
            decision = self.budget.check(model)
            if decision.spent:
                self.escalator.escalate(
                    model.name, EscalationReason.BUDGET_SPENT, decision.reason,
                    f"find out why {model.name} keeps failing (`mlx-medic log --model"
                    f" {model.name}`) and fix it; {resume_hint(model.name)}",
                )
                self._event(Disposition.CIRCUIT_OPEN, event, model=model.name,
                            detail=decision.reason)
                return Disposition.CIRCUIT_OPEN
            if not decision.allowed:
                self._event(Disposition.BACKOFF, event, model=model.name, detail=decision.reason)
                return Disposition.BACKOFF

        run_id = self.journal.create_alert_run(
            model=model.name, playbook=playbook_name, owner=self.owner, now=self.clock(),
            alertname=event.alertname, fingerprint=event.fingerprint, starts_at=key[1],
            labels=dict(event.labels), dry_run=dry_run,
        )
        self._remember(key)
        if run_id is None:  # another process recorded this firing first
            self._event(Disposition.DUPLICATE, event, model=model.name,
                        detail="firing recorded by another process")
            return Disposition.DUPLICATE
        run = _Run(run_id, model.name, self.playbooks[playbook_name], dry_run, "alert",
                   {event.fingerprint}, firing=key)
        self._runs[model.name] = run
        self._spawn(run)
        self._event(Disposition.STARTED, event, model=model.name, run_id=run_id,
                    detail=f"run {run_id} queued ({playbook_name}{', dry run' if dry_run else ''})")
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
        """Journal the end of a run once, count it, free the model's slot."""
        if run.ended:
            return
        run.ended = True
        now = self.clock()
        outcome, detail, next_action = end
        self.journal.end_run(run.run_id, outcome, now, detail, next_action)
        self.m_remediations.labels(model=run.model, outcome=outcome).inc()
        view = self.journal.get_run(run.run_id)
        if view is not None and view.started_at is not None:
            self.m_duration.observe(max(0.0, now - view.started_at))
        if self._runs.get(run.model) is run:
            del self._runs[run.model]
        log.info("run %s of %s ended: %s", run.run_id, run.model, outcome,
                 extra={"model": run.model, "run_id": run.run_id, "outcome": outcome,
                        "detail": detail})

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
            model=model.name, playbook=playbook_name, trigger_kind="manual", owner=self.owner,
            now=self.clock(), dry_run=dry_run,
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
                model, self.inventory, transport=self.transport,
                probe_from=self.config.probe_from, this_node=self.this_node,
            )
        except Exception as exc:
            log.warning("health check of %s failed: %s", model.name, exc)
            return HealthVerdict.unknown(f"health check raised {type(exc).__name__}: {exc}")

    def _forget_firing(self, run: _Run) -> None:
        """Let a redelivery of this firing try again (nothing was done for it)."""
        if run.firing is not None:
            self.journal.forget_firing(*run.firing)
            self._seen.pop(run.firing, None)

    async def _execute(self, run: _Run) -> None:
        """One run from queue to end. The lock is released before the run is marked
        ended, so the next run of the model never finds our own lock still there."""
        model = self.inventory.model(run.model)
        holding: list[LockHandle] = []
        end: _End | None = None
        try:
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
        context = RunContext(
            model=model, inventory=self.inventory, transport=self.transport,
            run_id=run.run_id, health=self._health, log=log,
        )
        if run.trigger == "alert":
            control = self.journal.blocking_control(model.name)
            if control is not None:
                self._forget_firing(run)
                return _End(RunOutcome.SKIPPED, f"{control.kind} set before the run started")
            verdict = await run.playbook.recheck(context)
            if not verdict.should_act:
                if verdict.retry:
                    self._forget_firing(run)
                else:
                    self._event(Disposition.STALE, None, model=model.name, run_id=run.run_id,
                                detail=verdict.reason)
                return _End(RunOutcome.SKIPPED, verdict.reason)
            log.info("run %s of %s acts: %s", run.run_id, model.name, verdict.reason,
                     extra={"model": model.name, "run_id": run.run_id})
        holder = "manual" if run.trigger == "manual" else "remediator"
        run.phase = "starting"  # no longer cancellable: a half-taken lock must not leak
        handle = await self.locks.acquire(model.name, holder, str(run.run_id))
        if handle is None:
            why = self.locks.refusals.get(model.name, "locked")
            return _End(RunOutcome.LOCKED, why if why.startswith("locked") else f"locked: {why}")
        holding.append(handle)
        run.phase = "executing"
        self.journal.start_run(run.run_id, self.clock())
        self.m_in_progress.labels(model=model.name).set(1)
        return await self._walk(run, model, context)

    def _interrupt_steps(self, run: _Run) -> None:
        view = self.journal.get_run(run.run_id)
        for step in view.steps if view else []:
            if step.outcome == StepOutcome.RUNNING:
                self.journal.end_step(step.id, StepOutcome.INTERRUPTED, self.clock(),
                                      detail="the run stopped while this step ran")

    async def _walk(self, run: _Run, model: Model, context: RunContext) -> _End:
        """Walk the plan: each step journaled before it starts, its result deciding what
        comes next."""
        plan = run.playbook.plan(model, self.inventory)
        if not plan:
            return _End(RunOutcome.FAILED, "the playbook planned no steps")
        described = [step.describe() for step in plan]
        if run.dry_run:
            for seq, about in enumerate(described, 1):
                self._begin_step(run, seq, about, outcome=StepOutcome.PLANNED)
            return _End(
                RunOutcome.PLANNED, f"dry run: {len(plan)} steps planned, nothing executed"
            )

        self.journal.mark_counted(run.run_id)
        step_timeout = max(model.policy.start_timeout, self.inventory.ssh.command_timeout) + 60
        verify_failed = False
        for seq, (step, about) in enumerate(zip(plan, described, strict=True), 1):
            if step.fallback and not verify_failed:
                continue
            step_id = self._begin_step(run, seq, about)
            result = await self._run_step(run.run_id, step, about, context, step_timeout)
            self.journal.end_step(
                step_id, result.outcome, self.clock(), exit_status=result.exit_status,
                output=result.output, detail=result.detail,
            )
            where = f"{about.name} on {about.node}"
            if result.outcome == StepOutcome.NOT_IMPLEMENTED:
                remaining = _summarise(
                    [d for s, d in zip(plan[seq - 1 :], described[seq - 1 :], strict=True)
                     if not s.fallback]
                )
                detail = f"step {where} has no implementation yet; nothing was done to {model.name}"
                action = f"recover {model.name} by hand ({remaining}); {resume_hint(model.name)}"
                return self._escalate(run, EscalationReason.NOT_IMPLEMENTED, detail, action)
            if result.unrecoverable:
                detail = result.detail or f"{where} found a state a restart cannot fix"
                action = result.next_action or f"recover {model.name} by hand"
                return self._escalate(
                    run, EscalationReason.UNRECOVERABLE, detail,
                    f"{action}; {resume_hint(model.name)}",
                )
            if result.outcome == StepOutcome.INCONCLUSIVE:
                return _End(
                    RunOutcome.INCONCLUSIVE, f"step {where}: {result.detail}",
                    f"find out by hand whether {model.name} serves on {model.head}"
                    f" ({model.host}:{model.port}); the run: `mlx-medic log --model {model.name}`",
                )
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.OK:
                self._verified(model, result.backend)
                on = f" on {result.backend}" if result.backend else ""
                return _End(RunOutcome.SUCCEEDED, f"{model.name} verified healthy{on}")
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.FAILED:
                verify_failed = True
                continue
            if result.outcome in (StepOutcome.OK, StepOutcome.SKIPPED):
                continue
            ended = "failed" if result.outcome == StepOutcome.FAILED else f"ended {result.outcome}"
            detail = f"step {where} {ended}: {result.detail}".rstrip(": ")
            action = (
                f"read the step's output (`mlx-medic log --model {model.name}`), recover"
                f" by hand; {resume_hint(model.name)}"
            )
            return self._escalate(run, EscalationReason.STEP_FAILED, detail, action)
        return self._escalate(
            run, EscalationReason.STEP_FAILED, "the playbook ended without a verified start",
            f"recover {model.name} by hand; {resume_hint(model.name)}",
        )

    async def _run_step(
        self, run_id: int, step: Step, about: StepDescription, context: RunContext,
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
        self, run: _Run, reason: EscalationReason, detail: str, next_action: str
    ) -> _End:
        self.escalator.escalate(run.model, reason, detail, next_action, run_id=run.run_id)
        return _End(RunOutcome.ESCALATED, detail, next_action)

    def _begin_step(
        self, run: _Run, seq: int, about: StepDescription,
        outcome: StepOutcome = StepOutcome.RUNNING,
    ) -> int:
        return self.journal.begin_step(
            run.run_id, seq=seq, name=about.name, node=about.node, command=about.argv,
            description=about.description, targets=list(about.targets), now=self.clock(),
            outcome=outcome,
        )


def _summarise(steps: list[StepDescription]) -> str:
    """`stop-service on ai001, sweep on ai001, ai002, then start-jaccl on ai001`."""
    groups: list[tuple[str, list[str]]] = []
    for step in steps:
        if groups and groups[-1][0] == step.name:
            groups[-1][1].append(step.node)
        else:
            groups.append((step.name, [step.node]))
    return ", ".join(f"{name} on {', '.join(nodes)}" for name, nodes in groups)
