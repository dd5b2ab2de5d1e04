"""The runner: one queued run, from its queue to its end, with every step journaled.

A run asks its playbook whether the alert still holds (`recover`: is the model still
down? "could not tell" is not down), takes the model lock on the head node (waiting up
to `lock_wait` for a holder such as a serve wrapper starting its ranks, then asking the
playbook again, since that holder may have fixed it), and walks the playbook's plan of
steps, journaling each step before it starts. The first step's read-only question (the
preflight's facts) is asked while it re-checks and takes the lock. A node that does not
answer over SSH while the run re-checks or takes the lock ends it `unreachable` (never
`locked`): a warning, `mlx_medic_node_unreachable_total`, and the next action in words.
A node that answers but whose mlx-medic cannot serve the run as deployed (its inventory
unreadable, mlx-medic missing, its forced command refusing, another version:
mlx_medic.node.misconfiguration), found while the run re-checks, takes the lock or asks
its read-only preflight, ends it `misconfigured` the same way: nothing done, no budget
spent, no circuit opened (a run after the fix acts), a warning,
`mlx_medic_node_misconfigured_total`, and the fix as the next action. Found by a step
after one that acted, it escalates like any step that could not ask its nodes.

A dry run re-checks too (a re-check that could not tell, a node that did not answer,
is journaled as "not checked" and the plan journaled anyway), never takes the lock, and
journals every step of its plan as planned, a fallback with its condition ("only if the
start fails verification"), ending `planned` with what live mode would do (the
decision's budget and backoff). Every run journals why it acted (`recheck`): the
re-check's verdict, what was probed and from where, or that a person started it.

The runner owns the control flow: fallback steps only after a failed verify, a verify
that could not tell ends the run inconclusive, and a step that failed or found a state
a restart cannot fix escalates to a person. What a sweep could not end (uninterruptible
sleep: only a reboot of its node ends it) is no such state: the sweep's step ends ok,
the run keeps its survivors in its context and journals them (`run_survivors`), and
goes on to start and verify. A verified run ends `succeeded` naming the survivors left;
an escalation of a run that met any carries their reboot advice (after a failed verify,
a survivor holding the model's port makes "reboot NODE" the next action).

How a run ends is handed to `finish` (the engine's: journal, metrics, its slot)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockHandle, LockRefused, ModelLocks
from mlx_medic.node.client import NodeHelpers, helper_argv
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.remediator.active_run import ActiveRun, RunEnd
from mlx_medic.remediator.budget import Escalator, resume_hint
from mlx_medic.remediator.config import ConfigSource, command_line
from mlx_medic.remediator.engine_metrics import EngineMetrics
from mlx_medic.remediator.journal import Journal, JournalError
from mlx_medic.remediator.outcomes import EscalationReason, RunOutcome, StepOutcome
from mlx_medic.remediator.run_survivors import (
    known_unkillable,
    merged_survivors,
    record_unkillable,
)
from mlx_medic.remediator.steps import (
    HealthCheck,
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
    describe_plan,
)
from mlx_medic.remediator.steps.sweep import survivor_escalation
from mlx_medic.transport import NodeTransport, TransportError
from mlx_medic.transport.ssh_options import ssh_command_line

log = logging.getLogger("mlx_medic.remediator.engine")  # the engine's parts log as one
MANUAL_RECHECK = "no re-check: started by hand"
DRY_RUN_LOCK = "lock: not taken (dry run)"


@dataclass
class Runner:
    """Runs the engine's runs; holds no state of its own between them."""

    inventory: Inventory
    journal: Journal
    transport: NodeTransport
    locks: ModelLocks
    helpers: NodeHelpers
    escalator: Escalator
    metrics: EngineMetrics
    clock: Callable[[], float]
    lock_wait: float  # how long an alert's run waits for another holder's lock
    slots: asyncio.Semaphore  # runs acting at once (max_parallel_runs); the rest wait queued
    health: HealthCheck  # the model's health verdict; never raises
    stale: Callable[[str, int, str], None]  # (model, run id, why): journal a re-check's "no"
    finish: Callable[[ActiveRun, RunEnd], None]  # journal a run's end once, free its slot
    config_source: ConfigSource | None = None  # the service's config: its commands name it

    def _command(self, *words: str) -> str:
        """`mlx-medic WORDS` for a next action, reaching the journal this service writes."""
        return command_line(self.config_source, *words)

    async def execute(self, run: ActiveRun) -> None:
        """One run from queue to end. The lock is released before the run is marked
        ended, so the next run of the model never finds our own lock still there."""
        model = self.inventory.model(run.model)
        holding: list[LockHandle] = []
        end: RunEnd | None = None
        try:
            if run.after is not None:  # a run that acts while the model serves goes first
                await asyncio.wait({run.after})
            async with self.slots:  # past max_parallel_runs a run waits here, still queued
                end = await self._attempt(run, model, holding)
        except asyncio.CancelledError:
            if not run.ended:
                self._interrupt_steps(run)
                end = RunEnd(RunOutcome.INTERRUPTED, "the remediator stopped during this run")
            raise
        except Exception as exc:
            log.exception("run %s of %s crashed", run.run_id, model.name)
            self._interrupt_steps(run)
            end = RunEnd(RunOutcome.FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.metrics.in_progress.labels(model=model.name).set(0)
            for handle in holding:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.locks.release(handle))
            if end is not None:
                self.finish(run, end)

    async def _attempt(self, run: ActiveRun, model: Model, holding: list[LockHandle]) -> RunEnd:
        """Re-check (the playbook's), lock, walk the plan; the plan's first step may ask
        its read-only question meanwhile (Step.read_ahead)."""

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
            health=self.health,
            log=log,
            helpers=self.helpers,
            release_lock=release_lock,
            nodes=tuple(n for n in model.nodes if n in run.nodes),
            known_unkillable=known_unkillable(self.journal, model.name),
            host=self.locks.hostname,
            pid=self.locks.pid,
            journal=self.journal,
            successor=run.successor,
            settle=run.settle,
        )
        alert = run.trigger in ("alert", "startup")  # both re-check before they act
        if alert:
            control = self.journal.blocking_control(model.name)
            if run.playbook.node_scoped and control is not None and control.kind == "pause":
                control = None  # its re-check judges the pauses of every model on the node
            if control is not None:  # a person said hands off: nothing is asked of a node
                return RunEnd(RunOutcome.SKIPPED, f"{control.kind} set before the run started")
        else:
            self._note_recheck(run, MANUAL_RECHECK)
        plan = run.playbook.plan_for(model, self.inventory, context.nodes)
        if run.dry_run:
            return await self._plan_only(run, model, context, plan, alert)
        ahead = plan[0].read_ahead(context) if plan else None
        asked = asyncio.create_task(ahead) if ahead is not None else None
        try:
            return await self._lock_and_walk(run, model, context, plan, holding, asked, alert)
        finally:
            if asked is not None:  # unused when the run ended before its first step
                asked.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asked

    async def _lock_and_walk(
        self,
        run: ActiveRun,
        model: Model,
        context: RunContext,
        plan: list[Step],
        holding: list[LockHandle],
        asked: asyncio.Task[object] | None,
        alert: bool,
    ) -> RunEnd:
        """Re-check (`alert`) and take the lock while the first step's read-only question is
        asked (`asked`); an answer from before a wait for the lock is not used."""
        if alert:
            skipped = await self._recheck(run, model, context)
            if skipped is not None:
                return skipped
        holder = "manual" if run.trigger == "manual" else "remediator"
        run.phase = "starting"  # no longer cancellable: a half-taken lock must not leak
        # A person waits at a terminal for a manual run: it never waits for the lock, but
        # for a start in progress after a boot.
        wait = self.lock_wait if alert else 0.0
        if run.playbook.waits_for_start:
            wait = max(self.lock_wait, model.policy.start_timeout)
        handle = await self.locks.acquire(model.name, holder, str(run.run_id), wait=wait)
        match handle:
            case LockRefused(kind="unreachable", why=why, node=silent):
                return self._unreachable(model, silent, f"taking the model lock: {why}")
            case LockRefused(kind="misconfigured", misconfiguration=found) if found is not None:
                return self._misconfigured(model, [found], "taking the model lock")
            case LockRefused(kind="helper_failed", why=why, node=head):  # no holder found
                return self._lock_helper_failed(model, head, why)
            case LockRefused(why=why, node=head):  # held, or its holder cannot be judged
                return self._locked(model, head, why)
        holding.append(handle)
        if handle.waited == 0:
            context.read_ahead = asked
        elif asked is not None:  # asked before the wait: the holder may have changed things
            asked.cancel()
        if alert and handle.waited > 0:  # the holder (a serve wrapper?) may have fixed it
            skipped = await self._recheck(run, model, context)
            if skipped is not None:
                return skipped
        return await self._execute(run, model, context, plan)

    async def _plan_only(
        self, run: ActiveRun, model: Model, context: RunContext, plan: list[Step], alert: bool
    ) -> RunEnd:
        """A dry run: the re-check (`alert`; one that could not tell is noted, and the plan
        journaled anyway), never the lock, then every step of the plan journaled as
        planned, whether or not the nodes answer."""
        if alert:
            skipped = await self._recheck(run, model, context)
            if skipped is not None:
                return skipped
        return await self._execute(run, model, context, plan)

    async def _execute(
        self, run: ActiveRun, model: Model, context: RunContext, plan: list[Step]
    ) -> RunEnd:
        run.phase = "executing"
        self.journal.start_run(run.run_id, self.clock())
        self.metrics.in_progress.labels(model=model.name).set(1)
        return await self._walk(run, model, context, plan)

    async def _recheck(self, run: ActiveRun, model: Model, context: RunContext) -> RunEnd | None:
        """The playbook's re-check, journaled with the run: None to act, else how the run
        ends. A dry run that could not tell goes on (None): it notes what it could not
        check and plans anyway."""
        verdict = await run.playbook.recheck(context)
        self._note_recheck(run, verdict.journaled(dry_run=run.dry_run))
        if run.dry_run and verdict.undecided:  # counted still: their alerts tell on-call
            if verdict.unreachable_node is not None:
                self.metrics.node_unreachable(model.name, verdict.unreachable_node)
            if verdict.misconfiguration is not None:
                self.metrics.node_misconfigured(model.name, verdict.misconfiguration)
            return None
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
        if verdict.misconfiguration is not None:
            return self._misconfigured(model, [verdict.misconfiguration], "re-check")
        if not verdict.undecided:
            self.stale(model.name, run.run_id, verdict.reason)
        return RunEnd(RunOutcome.SKIPPED, verdict.reason)

    def _note_recheck(self, run: ActiveRun, recheck: str) -> None:
        """Journal why the run acts (or not); a journal that fails to record it fails
        the run's next write, not this one (it is for on-call to read)."""
        with contextlib.suppress(JournalError):
            self.journal.record_recheck(run.run_id, recheck)

    def _unreachable(self, model: Model, node_name: str, detail: str) -> RunEnd:
        """A node the run needed did not answer: nothing was done; say what to check."""
        self.metrics.node_unreachable(model.name, node_name)
        node = self.inventory.node(node_name)
        # a helper the remediator's key may call (its forced command refuses `true`)
        ssh = ssh_command_line(node, self.inventory.ssh, *helper_argv(node, "facts", ()))
        return RunEnd(
            RunOutcome.UNREACHABLE,
            f"{node_name} did not answer over SSH ({detail})",
            f"nothing was done to {model.name}: check that {node_name} is up and its"
            f" mlx-medic answers over SSH as the remediator connects (`{ssh}` as the"
            " remediator's user: a JSON document of the node's facts) and that"
            f" {self.inventory.state_dir / 'locks'} there is writable; the next notification"
            f" of the alert starts a new run, or run `{self._command('remediate', model.name)}`",
        )

    def _locked(self, model: Model, head: str, why: str) -> RunEnd:
        """Another holder has the model lock (or it cannot be judged): nothing was done."""
        return RunEnd(
            RunOutcome.LOCKED,
            f"the model lock on {head}: {why}",
            f"nothing was done to {model.name}: wait for that holder to let go (a serve wrapper"
            " holds it while its ranks start); the next run breaks a dead holder's lock (its"
            " pid gone on its node; off the inventory's nodes, its lease run out), never one it"
            " cannot judge: fix what the detail names; the next notification of the alert"
            f" starts a new run, or run `{self._command('remediate', model.name)}`",
        )

    def _lock_helper_failed(self, model: Model, head: str, why: str) -> RunEnd:
        """The head's lock helper answered with an error: no holder was found (not `locked`)
        and nothing was done (no budget spent, no circuit opened); its error is the clue."""
        show = shlex.join(helper_argv(self.inventory.node(head), "lock", [model.name, "show"]))
        return RunEnd(
            RunOutcome.FAILED,
            why,
            f"nothing was done to {model.name}, no holder was found: fix what the lock helper"
            f" says on {head} (`{show}` there, as the login user, runs it again); the next"
            " notification of the alert starts a new run, or run"
            f" `{self._command('remediate', model.name)}`",
        )

    def _misconfigured(
        self, model: Model, found: Sequence[Misconfiguration], during: str, count: bool = True
    ) -> RunEnd:
        """Nodes the run needed are deployed wrong for it, found before anything acted:
        nothing was done, so, as for an unreachable node, no budget is spent and no circuit
        opens: MLXMedicMisconfigured pages on-call with the fix, and the first run after
        the fix acts (an open circuit would hold it back for a `resume` nobody needs)."""
        for each in found if count else ():
            self.metrics.node_misconfigured(model.name, each)
        return RunEnd(
            RunOutcome.MISCONFIGURED,
            f"{during}: " + "; ".join(str(each) for each in found),
            f"nothing was done to {model.name}: {'; '.join(each.fix for each in found)}; then"
            " the next notification of the alert starts a new run, or run"
            f" `{self._command('remediate', model.name)}`",
        )

    def _interrupt_steps(self, run: ActiveRun) -> None:
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

    async def _walk(
        self, run: ActiveRun, model: Model, context: RunContext, plan: list[Step]
    ) -> RunEnd:
        """Walk the plan: each step journaled before it starts, its result deciding what
        comes next."""
        if not plan:
            return RunEnd(RunOutcome.FAILED, "the playbook planned no steps")
        described = describe_plan(plan)
        if run.dry_run:
            for seq, about in enumerate(described, 1):
                self._begin_step(run, seq, about, outcome=StepOutcome.PLANNED)
            planned = f"dry run: {len(plan)} steps planned, nothing executed"
            parts = [planned, DRY_RUN_LOCK, run.live_would]
            return RunEnd(RunOutcome.PLANNED, "; ".join(part for part in parts if part))

        acted = False  # a step that may change a node has started: the run spends budget
        step_timeout = max(model.policy.start_timeout, self.inventory.ssh.command_timeout) + 60
        verify_failed = False
        done: list[str] = []  # steps that did their part: an escalation names them
        for seq, (step, about) in enumerate(zip(plan, described, strict=True), 1):
            if step.fallback and not verify_failed:
                continue
            if not step.read_only and not acted:
                self.journal.mark_counted(run.run_id)
                acted = True
            step_id = self._begin_step(run, seq, about)
            result = await self._run_step(
                run.run_id, step, about, context, step.timeout(step_timeout)
            )
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
                self.metrics.node_unreachable(model.name, node_name)
            for found in result.misconfigured:
                self.metrics.node_misconfigured(model.name, found)
            if result.misconfigured and not result.unreachable and not acted:
                return self._misconfigured(
                    model, result.misconfigured, f"step {where}", count=False
                )
            if result.survivors is not None:
                context.survivors = merged_survivors(context.survivors, result.survivors)
            if result.unkillable is not None:
                record_unkillable(
                    journal=self.journal,
                    inventory=self.inventory,
                    gauge=self.metrics.unkillable,
                    clock=self.clock,
                    run_id=run.run_id,
                    model=model,
                    result=result,
                    context=context,
                )
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
                return RunEnd(
                    RunOutcome.INCONCLUSIVE,
                    f"step {where}: {result.detail}",
                    f"find out by hand whether {model.name} serves on {model.head}"
                    f" ({model.host}:{model.port}); the run:"
                    f" `{self._command('log', '--model', model.name)}`",
                )
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.OK:
                self.metrics.verified(model, result.backend)
                on = f" on {result.backend}" if result.backend else ""
                left = context.survivors
                said = (
                    f"; survivors left: {left.describe(self.inventory)}"
                    if left is not None and left.survivors
                    else ""
                )
                return RunEnd(RunOutcome.SUCCEEDED, f"{model.name} verified healthy{on}{said}")
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.FAILED:
                verify_failed = True
                continue
            if step.kind is StepKind.VERIFY and result.outcome == StepOutcome.SKIPPED:
                # a "still serving" check of a model that was not serving: the steps before
                # it did their work, the model is LLMModelDown's (sweep-orphans)
                swept = f"{', '.join(done)} done; " if done else ""
                return RunEnd(RunOutcome.SUCCEEDED, f"{swept}{result.detail}")
            if result.outcome in (StepOutcome.OK, StepOutcome.SKIPPED):
                done += [where] if result.outcome == StepOutcome.OK else []
                continue
            ended = "failed" if result.outcome == StepOutcome.FAILED else f"ended {result.outcome}"
            detail = f"step {where} {ended}: {result.detail}".rstrip(": ")
            log_command = self._command("log", "--model", model.name)
            action = f"read the step's output (`{log_command}`), recover by hand"
            return self._escalate(
                run,
                EscalationReason.STEP_FAILED,
                detail,
                action,
                context,
                after_start=verify_failed,
            )
        if run.playbook.leaves_stopped and not verify_failed:
            return RunEnd(
                RunOutcome.SUCCEEDED, f"{', '.join(done)} done; {model.name} left stopped"
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

    def _escalate(
        self,
        run: ActiveRun,
        reason: EscalationReason,
        detail: str,
        next_action: str,
        context: RunContext,
        *,
        after_start: bool,
    ) -> RunEnd:
        """Tell on-call; open the model's circuit (and say how to close it) unless the
        playbook has its own budget. A run whose sweep left survivors names them and
        carries their reboot advice (after a failed verify, a survivor holding the port
        makes its reboot the next action: `survivor_escalation`)."""
        detail, next_action = survivor_escalation(
            context.survivors, self.inventory, detail, next_action, after_start=after_start
        )
        opens = not run.playbook.own_budget
        if opens:
            next_action = f"{next_action}; {resume_hint(run.model, self.config_source)}"
        self.escalator.escalate(
            run.model, reason, detail, next_action, run_id=run.run_id, open_circuit=opens
        )
        return RunEnd(RunOutcome.ESCALATED, detail, next_action)

    def _begin_step(
        self,
        run: ActiveRun,
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
            condition=about.condition,
        )
