"""The engine: decides what to do with each alert, and runs playbooks in the background.

`submit` only decides and queues (a few journal writes, no awaits in between, so
concurrent deliveries cannot interleave): Alertmanager retries slow receivers,
and a slow answer would turn into duplicate deliveries. The engine wires its parts,
each readable alone:

  decision.py          alert -> disposition: the rules, their order, the dedupe rule
  runner.py            a run from queue to end: re-check, lock, steps, escalation
  run_survivors.py     what a run's sweeps could not end (survivors, unkillable processes)
  startup.py           what a dead process left in flight
  engine_metrics.py    the metrics of runs, escalations, unreachable and misconfigured
                       nodes
  decision_records.py  decisions' events (the storm's deferred), run ends a failing
                       journal refused
  active_run.py        the record of a run in flight that they share

and keeps what ties them together: the runs in flight (one per model; runs of different
models act in parallel, at most `max_parallel_runs` at once), the cache of
firings held, the journal's deferred writes, and the end of every run (`_finish`).

Nothing acts unrecorded: every decision that acts is journaled before it acts, and a
journal write that fails (JournalError) ends the delivery: the web layer answers 503,
which Alertmanager retries. `journal_problem` says when the journal cannot record.

The engine is given its playbooks as instances by name (`builtin_playbooks(config)`,
set as the config says, unless told otherwise); the config routes alert names to those
names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import ModelLocks
from mlx_medic.node.client import REMEDIATOR, NodeHelpers
from mlx_medic.remediator.active_run import ActiveRun, RunEnd
from mlx_medic.remediator.alerts import AlertEvent, Disposition, InvalidAlert
from mlx_medic.remediator.budget import Budget, Escalator
from mlx_medic.remediator.config import ConfigSource, RemediatorConfig, check_routing
from mlx_medic.remediator.decision import (
    RECORDED_ELSEWHERE,
    Decision,
    JournalFacts,
    Start,
    decide,
    rejection,
)
from mlx_medic.remediator.decision_records import DecisionRecords
from mlx_medic.remediator.engine_metrics import EngineMetrics
from mlx_medic.remediator.journal import Journal, owner_tag
from mlx_medic.remediator.model_health import HealthVerdict, probe_model_health, remediator_node
from mlx_medic.remediator.outcomes import RUN_HOLDS_FIRING, RunOutcome
from mlx_medic.remediator.playbooks import Playbook, builtin_playbooks
from mlx_medic.remediator.runner import Runner
from mlx_medic.remediator.startup import StartupRecovery
from mlx_medic.remediator.steps import HealthCheck
from mlx_medic.transport import NodeTransport

log = logging.getLogger("mlx_medic.remediator.engine")

SEEN_CACHE = 100_000
# A dry run by hand: what its live run would do (no re-check, budget or backoff applies)
MANUAL_LIVE_WOULD = "live mode would act now if the model lock is free (started by hand)"
# Run endings worth a warning: nothing was fixed and the reason is not another holder.
_WARN = {
    RunOutcome.UNREACHABLE,
    RunOutcome.MISCONFIGURED,
    RunOutcome.INCONCLUSIVE,
    RunOutcome.FAILED,
    RunOutcome.INTERRUPTED,
}


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
        config_source: ConfigSource | None = None,
    ):
        """`playbooks`: name -> instance, the names `config.routing` may use (the
        built-in ones by default); a routed name it lacks is a ConfigError.
        `config_source`: the config file read, which the commands in next actions name
        (`--config.file` unless it is at the default path)."""
        self.playbooks = dict(builtin_playbooks(config) if playbooks is None else playbooks)
        check_routing(config.routing, self.playbooks)
        self.config = config
        self.config_source = config_source
        self.inventory = inventory
        self.this_node = remediator_node(config.node, inventory)
        self.journal = journal
        self.transport = transport
        self.clock = clock
        self.hostname = hostname or socket.gethostname()
        self.owner = owner_tag(self.hostname)
        self._health_check = health_check
        helpers = NodeHelpers(
            transport, inventory, timeout=inventory.ssh.command_timeout, caller=REMEDIATOR
        )
        self.locks = ModelLocks(
            inventory,
            transport,
            this_node=self.this_node,
            hostname=self.hostname,
            clock=clock,
            lease=config.lock_lease,
            caller=REMEDIATOR,
        )
        self.budget = Budget(journal, clock)
        self._runs: dict[str, ActiveRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._facts = JournalFacts(journal, self.budget, clock, self._seen)
        self._closing = False
        self._writes = DecisionRecords(journal, clock)

        self.metrics = EngineMetrics(registry, inventory, journal)
        self.metrics.journal_failing.set_function(lambda: float(self.journal_problem() is not None))
        # the names other code and the tests read
        self.m_remediations = self.metrics.remediations
        self.m_duration = self.metrics.duration
        self.m_in_progress = self.metrics.in_progress
        self.m_last_verified_backend = self.metrics.last_verified_backend
        self.m_escalations = self.metrics.escalations
        self.m_unreachable = self.metrics.unreachable
        self.m_unkillable = self.metrics.unkillable
        self.escalator = Escalator(
            journal,
            self.m_escalations,
            notify_url=config.notify_url,
            hostname=self.hostname,
            clock=clock,
        )
        self.runner = Runner(
            inventory=inventory,
            journal=journal,
            transport=transport,
            locks=self.locks,
            helpers=helpers,
            escalator=self.escalator,
            metrics=self.metrics,
            clock=clock,
            lock_wait=config.lock_wait,
            slots=asyncio.Semaphore(config.max_parallel_runs),
            health=self._health,
            stale=self._stale,
            finish=self._finish,
            config_source=config_source,
        )

    @property
    def helpers(self) -> NodeHelpers:
        """The node helpers runs and start-up call (the runner's: a test may swap them)."""
        return self.runner.helpers

    @helpers.setter
    def helpers(self, helpers: NodeHelpers) -> None:
        self.runner.helpers = helpers

    # --- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Mark what a dead process left in flight, and release the locks those runs held."""
        await StartupRecovery(
            inventory=self.inventory,
            journal=self.journal,
            locks=self.locks,
            helpers=self.helpers,
            playbooks=self.playbooks,
            metrics=self.metrics,
            clock=self.clock,
            hostname=self.hostname,
            owner=self.owner,
            queue=self._queue,
            config_source=self.config_source,
        ).recover()

    async def close(self) -> None:
        """Cancel runs in flight (journaled as interrupted, locks released)."""
        self._closing = True
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.escalator.drain(timeout=2.0)
        self._writes.close()

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no run is queued or running (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._tasks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("runs still in flight")
            await asyncio.wait(set(self._tasks), timeout=remaining)

    def journal_problem(self) -> str | None:
        """None when the journal records; else why not, and nothing may act
        (`DecisionRecords.problem`)."""
        return self._writes.problem()

    def _stale(self, model: str, run_id: int, reason: str) -> None:
        """A run's re-check found its alert no longer holds: journaled like a decision."""
        self._writes.event(Disposition.STALE, None, model=model, run_id=run_id, detail=reason)

    # --- decisions --------------------------------------------------------

    def reject(self, invalid: InvalidAlert) -> Disposition:
        """Journal an alert that could not be read, with its reason; nothing acts on it."""
        decision = rejection(invalid, self.inventory)
        self._writes.event(
            decision.disposition,
            None,
            model=decision.model,
            fingerprint=invalid.fingerprint[:128] or None,
            detail=decision.detail,
        )
        return decision.disposition

    def note(self, kind: str, detail: str) -> None:
        """Journal what a delivery as a whole met (webapp: invalid alerts folded into one
        event, a delivery cut short by a limit): one event, not one per alert."""
        self._writes.event(kind, None, detail=detail)

    def _remember(self, key: tuple[str, str]) -> None:
        self._seen[key] = None
        if len(self._seen) > SEEN_CACHE:
            self._seen.popitem(last=False)

    async def submit(self, event: AlertEvent) -> Disposition:
        """Decide, journal, maybe queue a run. Never runs a playbook inline."""
        decision = decide(
            event,
            config=self.config,
            inventory=self.inventory,
            playbooks=self.playbooks,
            runs=self._runs,
            facts=self._facts,
            config_source=self.config_source,
        )
        if decision.start is not None:
            return self._start(event, decision, decision.start)
        if decision.disposition is Disposition.ABSORBED:
            return self._absorb(event, decision)
        if decision.disposition is Disposition.DUPLICATE:
            self._remember(event.dedupe_key)
        if decision.run is not None:  # resolved: the run lets go of the alert
            decision.run.fingerprints.discard(event.fingerprint)
            if decision.cancel is not None:
                self._cancel_queued(decision.run, decision.cancel)
        if decision.escalation is not None:
            assert decision.model is not None
            self.escalator.escalate(decision.model, *decision.escalation)
        self._writes.event(
            decision.disposition, event, model=decision.model, detail=decision.detail
        )
        return decision.disposition

    def _absorb(self, event: AlertEvent, decision: Decision) -> Disposition:
        """The alert joins the model's run in flight: that run holds its firing now."""
        run, key = decision.run, event.dedupe_key
        assert run is not None and decision.model is not None
        run.join(decision.nodes)
        self.journal.record_firing(*key, decision.model, run.run_id, self.clock(), defer=True)
        self._remember(key)
        run.fingerprints.add(event.fingerprint)
        run.firings.add(key)
        self._writes.event(
            Disposition.ABSORBED,
            event,
            model=decision.model,
            run_id=run.run_id,
            detail=decision.detail,
        )
        return Disposition.ABSORBED

    def _start(self, event: AlertEvent, decision: Decision, start: Start) -> Disposition:
        """Journal the new run with its firing (one insert: a firing another process
        recorded first is a duplicate), then queue it."""
        key, model = event.dedupe_key, decision.model
        assert model is not None
        run_id = self.journal.create_alert_run(
            model=model,
            playbook=start.playbook_name,
            owner=self.owner,
            now=self.clock(),
            alertname=event.alertname,
            fingerprint=event.fingerprint,
            starts_at=key[1],
            labels=dict(event.labels),
            links=dict(event.links),
            dry_run=start.dry_run,
        )
        self._remember(key)
        if run_id is None:
            self._writes.event(Disposition.DUPLICATE, event, model=model, detail=RECORDED_ELSEWHERE)
            return Disposition.DUPLICATE
        run = ActiveRun(
            run_id,
            model,
            start.playbook,
            start.dry_run,
            "alert",
            {event.fingerprint},
            firings={key},
            nodes=set(decision.nodes),
            after=start.after.task if start.after is not None else None,
            live_would=start.live_would,
        )
        self._queue(run)
        if start.after is not None:
            start.after.successor.set()
        self._writes.event(
            Disposition.STARTED, event, model=model, run_id=run_id, detail=start.detail(run_id)
        )
        return Disposition.STARTED

    # --- runs -------------------------------------------------------------

    def _queue(self, run: ActiveRun) -> None:
        """The model's run from now on, started in the background."""
        self._runs[run.model] = run
        self._spawn(run)

    def _spawn(self, run: ActiveRun) -> None:
        task = asyncio.get_running_loop().create_task(self.runner.execute(run))
        run.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_queued(self, run: ActiveRun, why: str) -> None:
        run.cancelled = True
        self._finish(run, RunEnd(RunOutcome.CANCELLED, why))
        if run.task is not None:
            run.task.cancel()

    def _finish(self, run: ActiveRun, end: RunEnd) -> None:
        """Journal the end of a run once, count it, free the model's slot. An ending that
        does not hold its firings lets them go (see the decision's dedupe rule). An end
        the journal refuses is kept and written once it records again."""
        if run.ended:
            return
        run.ended = True
        now = self.clock()
        outcome, detail, next_action = end
        self._writes.end_run(run.run_id, run.model, end, now)
        if outcome not in RUN_HOLDS_FIRING:
            for key in run.firings:
                self._seen.pop(key, None)
        self.m_remediations.labels(model=run.model, outcome=outcome).inc()
        with contextlib.suppress(Exception):
            view = self.journal.get_run(run.run_id)
            if view is not None and view.started_at is not None:
                self.m_duration.labels(model=run.model).observe(max(0.0, now - view.started_at))
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

    async def run_manual(
        self, model_name: str, *, dry_run: bool, playbook: str | None = None
    ) -> int:
        """Run the model's playbook (or the one named) now, by hand: same lock, same
        journal; no re-check, budget, pause or circuit (a person decided). Returns the run
        id once it has ended."""
        try:
            model = self.inventory.model(model_name)
        except KeyError:
            known = ", ".join(m.name for m in self.inventory.models) or "none"
            raise KeyError(f"no model {model_name!r} in the inventory (known: {known})") from None
        playbook_name = playbook or self.config.routing.playbooks.get("LLMModelDown", "recover")
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
        run = ActiveRun(run_id, model.name, self.playbooks[playbook_name], dry_run, "manual")
        if dry_run:
            run.live_would = MANUAL_LIVE_WOULD
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
