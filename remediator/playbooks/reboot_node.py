"""`reboot-node`: issue 29's opt-in guarded reboot, the remediator's run for
MLXUnkillableSurvivors (its `node` label names the node; the alert names no model, so the
run is journaled under the first model placed on the node and holds that model's lock).

Off by default: a node whose `reboot.allowed` is false is declined before any run (the
alert is journaled unrouted with the `off` guard's words, as it was before this playbook).
Otherwise the run's re-check gathers what the guards read (remediator/reboot_guard.py): the
node's boot id, boot time and survivors (`node facts`), each model placed there (serving?
on which backend: the health probe and the head's serve record; its nodes that answer), a
person's pause (of the model or of all; not a pause a run set), and the reboot runs of any
node not ended (one node at a time, cluster-wide). A guard that refuses ends the run
skipped, its name and why in the run's detail and re-check; nothing was asked to act.

Allowed: pause every model on the node (a pause owned by the run: `by` names it), stop
and sweep each (the drain's steps), journal `rebooting NODE (boot id X)`, run the node's
`reboot.command` through `mlx-medic node reboot` (`sudo -n COMMAND...`), wait up to the
node's `reboot.boot_timeout` for a new boot id, clear the run's pauses, then each model's
undrain: stop, sweep, clean, start (the serve wrapper tries JACCL with its smoke test, the
ledger is the new boot's, empty), verify; the run's own model last, with recover's ring
pin as the fallback after a failed JACCL verify. A step that fails escalates (the pauses
the run set then stay: a person resumes after the fix).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperCallError
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.node.replies import RebootReply
from mlx_medic.remediator.model_health import ModelState
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook
from mlx_medic.remediator.reboot_guard import ClusterView, ModelView, Refusal, reboot_refusal
from mlx_medic.remediator.steps import (
    REMEDIATOR_RUN,
    Preflight,
    RunContext,
    Step,
    StepDescription,
    StepResult,
    StopService,
    Sweep,
)
from mlx_medic.remediator.steps.on_nodes import ask

REBOOT_NODE = "reboot-node"
REBOOT_EVENT = "reboot"  # the journal's "rebooting NODE (boot id X)"


def off_refusal(node: str) -> Refusal:
    return Refusal("off", f"nodes.{node}.reboot.allowed is false")


def person_paused(context: RunContext, model: str) -> bool:
    """A pause of the model (or of all models) a person set; not one a run set."""
    journal = context.journal
    if journal is None:
        return False
    return any(
        c.kind == "pause" and c.model in (None, model) and not c.by_whom.startswith(REMEDIATOR_RUN)
        for c in journal.controls()
    )


def nodes_rebooting(context: RunContext) -> frozenset[str]:
    """The nodes other reboot-node runs (not ended, this replica's or another's) act on."""
    if context.journal is None:
        return frozenset()
    return frozenset(
        run.labels.get("node") or f"(run {run.id})"
        for run in context.journal.unended_runs(REBOOT_NODE)
        if run.id != context.run_id
    )


async def gather_view(context: RunContext, node: str) -> ClusterView | RecheckVerdict:
    """What the guards read, asked now; a verdict instead when the node cannot tell."""
    inventory = context.inventory
    models = inventory.models_on(node)
    asked = sorted({node, *(n for m in models for n in m.nodes)})
    plain = await ask(context, asked, FactsReply)
    if node not in plain.replies:
        error = plain.errors[node]
        return RecheckVerdict.not_asked(f"{node} did not answer `node facts`", node, error)
    facts = plain.replies[node].answer
    if facts.booted_at is None or facts.boot_id is None:
        return RecheckVerdict.skip(f"{node} did not say its boot id and time", undecided=True)
    answering = frozenset(n for n, r in plain.replies.items() if r.ok)
    holding = any(s.domains > 0 for s in facts.survivors)
    views = []
    for model in models:
        health = await context.health(model)
        serving = health.state is ModelState.UP
        backend = None
        if serving:
            try:
                head = await context.node_helpers.call(model.head, FactsReply, model.name)
                backend = head.answer.serving_backend
            except HelperCallError:
                backend = None
        views.append(
            ModelView(
                name=model.name,
                serving=serving,
                backend=backend,
                healthy_nodes=frozenset(model.nodes) & answering,
                paused=person_paused(context, model.name),
                survivors_hold_its_domains=holding and model.backends.jaccl is not None,
            )
        )
    settings = inventory.node(node).reboot
    return ClusterView(
        node=node,
        allowed=settings.allowed,
        booted_at=facts.booted_at,
        now=time.time(),
        min_uptime=settings.min_uptime,
        rebooting=nodes_rebooting(context),
        models=tuple(views),
    )


@dataclass(frozen=True, kw_only=True)
class OnModel(Step):
    """Another model's step in this run: it runs with that model as its context's (the
    run holds the lock of its own model only; the others are paused by the run)."""

    steps: tuple[Step, ...]
    model: Model
    name: str = ""

    def describe(self) -> StepDescription:
        first = self.steps[0].describe()
        if len(self.steps) == 1:
            return first
        words = ", ".join(s.describe().name for s in self.steps)
        return StepDescription(
            self.name or "undrain",
            self.model.head,
            f"{self.model.name}: {words}, each as in recover (a failure ends the run)",
            targets=[self.model.name],
        )

    async def run(self, context: RunContext) -> StepResult:
        async def keep_lock() -> None:
            """The run's lock is its own model's: another model's start lets go of none."""

        own = replace(context, model=self.model, release_lock=keep_lock)
        said: list[str] = []
        result = StepResult(StepOutcome.OK)
        for step in self.steps:
            result = await step.run(own)
            said.append(f"{step.describe().name}: {result.detail}".rstrip(": "))
            if result.outcome not in (StepOutcome.OK, StepOutcome.SKIPPED):
                break
        if len(self.steps) == 1:
            return result
        return replace(result, detail="; ".join(said))


@dataclass(frozen=True, kw_only=True)
class SetPauses(Step):
    """Pause (or, after the reboot, resume) every model on the node, as this run: the
    pauses it sets name the run (`by`), so no guard takes them for a person's."""

    node: str
    models: tuple[str, ...]
    pause: bool = True

    def describe(self) -> StepDescription:
        what = "pause" if self.pause else "clear this run's pauses of"
        return StepDescription(
            "pause-models" if self.pause else "resume-models",
            self.node,
            f"{what} {', '.join(self.models)} (automatic remediation) while {self.node} reboots",
            targets=list(self.models),
        )

    async def run(self, context: RunContext) -> StepResult:
        journal = context.journal
        if journal is None:
            return StepResult(StepOutcome.SKIPPED, detail="no journal to record pauses in")
        done = []
        for model in self.models:
            if self.pause:
                reason = f"reboot of {self.node} by {context.by}"
                if journal.set_pause(model, reason=reason, by_whom=context.by, now=time.time()):
                    journal.add_event("paused", now=time.time(), model=model, detail=reason)
                    done.append(model)
                continue
            mine = [
                c
                for c in journal.controls()
                if c.kind == "pause" and c.model == model and c.by_whom == context.by
            ]
            if mine and journal.clear_pause(model):
                journal.add_event(
                    "resumed",
                    now=time.time(),
                    model=model,
                    detail=f"cleared the pause of {model}: {self.node} rebooted ({context.by})",
                )
                done.append(model)
        verb = "paused" if self.pause else "resumed"
        return StepResult(StepOutcome.OK, detail=f"{verb}: {', '.join(done) or 'none'}")


@dataclass(frozen=True, kw_only=True)
class RebootNode(Step):
    """Journal the node's boot id, run its reboot command (`mlx-medic node reboot`:
    `sudo -n COMMAND...`), wait for the node to answer with a new boot id."""

    node: str
    command: tuple[str, ...]
    boot_timeout: float
    poll_interval: float = 2.0

    def describe(self) -> StepDescription:
        return StepDescription(
            "reboot-node",
            self.node,
            f"journal {self.node}'s boot id, run its reboot command through `sudo -n`"
            f" (`mlx-medic node reboot`), wait up to {self.boot_timeout:g}s for a new boot id",
            targets=[self.node],
            argv=["sudo", "-n", *self.command],
        )

    def timeout(self, default: float) -> float:
        return max(default, self.boot_timeout + default)

    async def _boot_id(self, context: RunContext) -> str | None:
        try:
            reply = await context.node_helpers.call(self.node, FactsReply)
        except HelperCallError:
            return None
        return reply.answer.boot_id if reply.ok else None

    async def run(self, context: RunContext) -> StepResult:
        before = await self._boot_id(context)
        if before is None:
            return StepResult(StepOutcome.FAILED, detail=f"{self.node} did not say its boot id")
        if context.journal is not None:
            context.journal.add_event(
                REBOOT_EVENT,
                now=time.time(),
                model=context.model.name,
                run_id=context.run_id,
                detail=f"rebooting {self.node} (boot id {before}) by {context.by}",
            )
        try:
            reply = await context.node_helpers.call(self.node, RebootReply)
            if not reply.ok:
                said = (reply.answer.stderr or reply.stderr).strip()[-300:]
                return StepResult(
                    StepOutcome.FAILED,
                    detail=f"{' '.join(reply.answer.argv) or 'the reboot'} failed: {said}",
                    exit_status=reply.exit_status,
                )
        except HelperCallError as exc:  # the reboot ended the helper's connection
            context.log.info("%s: the reboot call ended without a reply: %s", self.node, exc)
        deadline = time.monotonic() + self.boot_timeout
        while time.monotonic() < deadline:
            now = await self._boot_id(context)
            if now is not None and now != before:
                context.survivors = None  # the reboot ended them: the run names none left
                return StepResult(
                    StepOutcome.OK, detail=f"{self.node} rebooted: boot {before} -> {now}"
                )
            await asyncio.sleep(self.poll_interval)
        return StepResult(
            StepOutcome.FAILED,
            detail=f"{self.node} did not answer with a new boot id within {self.boot_timeout:g}s"
            f" (still {before} or silent)",
            unrecoverable=True,
            next_action=f"see whether {self.node} rebooted; once it is back, `mlx-medic undrain`"
            " is not needed: resume its models (`mlx-medic resume MODEL`) and remediate them",
        )


@dataclass(frozen=True)
class RebootNodePlaybook(Playbook):
    """The guarded reboot of the node the alert names (see the module)."""

    own_budget: ClassVar[bool] = True
    per_node: ClassVar[bool] = True
    node_scoped: ClassVar[bool] = True
    poll_interval: float = 2.0
    undrain: RecoverPlaybook = field(default_factory=RecoverPlaybook)

    def declines(self, node: str, inventory: Inventory) -> str | None:
        if not inventory.node(node).reboot.allowed:
            return str(off_refusal(node))
        return None

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return []  # a run by hand names no node: nothing to plan

    def plan_for(self, model: Model, inventory: Inventory, nodes: Sequence[str]) -> list[Step]:
        if not nodes:
            return []
        node = nodes[0]
        settings = inventory.node(node).reboot
        others = [m for m in inventory.models_on(node) if m.name != model.name]
        names = tuple(m.name for m in [*others, model])
        reason = f"reboot of {node}: stopped until {node} has rebooted"
        steps: list[Step] = [SetPauses(node=node, models=names)]
        for each in [*others, model]:
            stop: list[Step] = [StopService(model=each, reason=reason), Sweep(model=each)]
            steps += [OnModel(steps=(s,), model=each) for s in stop] if each is not model else stop
        steps += [
            RebootNode(
                node=node,
                command=tuple(settings.command),
                boot_timeout=settings.boot_timeout,
                poll_interval=self.poll_interval,
            ),
            SetPauses(node=node, models=names, pause=False),
        ]
        for other in others:
            undrain = tuple(
                s
                for s in self.undrain.plan(other, inventory)
                if not s.fallback and not isinstance(s, Preflight)
            )  # stop, sweep, clean, start, verify: the first failure ends the run
            steps.append(OnModel(steps=undrain, model=other, name=f"undrain-{other.name}"))
        steps += [s for s in self.undrain.plan(model, inventory) if not isinstance(s, Preflight)]
        return steps

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        if not context.nodes:
            return RecheckVerdict.skip("the alert named no node of the model")
        node = context.nodes[0]
        view = await gather_view(context, node)
        if isinstance(view, RecheckVerdict):
            return view
        refusal = reboot_refusal(view)
        if refusal is not None:
            return RecheckVerdict.skip(str(refusal))
        needing = [m.name for m in view.models if m.survivors_hold_its_domains]
        return RecheckVerdict.act(
            f"every guard holds: survivors on {node} hold domains {', '.join(needing)} needs"
        )
