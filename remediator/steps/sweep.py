"""End the model's processes on every node at once, through `mlx-medic node sweep`.

Why every node, whatever the parent: the seed's orphans are ranks whose launcher died,
often parented by sshd on a peer. The helper finds them by the model's scope, checks
each identity again before signalling, spares a listener that serves, and reports a
survivor in uninterruptible sleep (`D` on Linux, `U` on macOS) as unkillable: only a
reboot of its node ends it, and the helper records it in that node's protection-domain
ledger (the node's exporter then pages `MLXUnkillableSurvivors`: reboot NODE).

What a survivor means here is the seed's final fix ("those already in Us+ survive but
stop accumulating"): the sweep did all a sweep can, so an unkillable survivor is never by
itself a failure and never leaves the service stopped (`mlx_medic.processes.survivors` is the one
policy, shared with the serve wrapper):

- a survivor that does not hold the model's port: the step ends ok, its detail names
  every survivor (node, pid, state, protection domains) and its node's reboot advice, and
  the start goes on around it (the serve wrapper starts JACCL while the ledger leaves
  room, else ring);
- a survivor that holds the model's port on its node: no start can listen there, but the
  start still happens (`recover`, `finish-stop`): under KeepAlive the serve wrapper keeps
  trying, and its own refusal names "reboot NODE" in its error and serve record, which an
  alert reads. The step ends ok with "next action: reboot NODE ..." in its detail; the
  verify then fails and the run escalates with that reboot advice as its next action
  (`survivor_escalation`), not "recover by hand";
- a killable survivor (something not in uninterruptible sleep that the sweep could not
  end, or a helper that failed otherwise) fails the step, as does a node that did not
  answer: nothing is started on top of what may still run.

With `orphans_only` (`sweep-orphans`, the model serving), survivors an earlier run named
(`RunContext.known_unkillable`) are counted, not named again: each is named once.

A process the node's login user may not signal (another user's) is not the model's to
end: the helper reports it in `not_ours` and it never fails the step; the detail names it
with its owner, so the log says what the sweep could not do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.replies import ProcessEntry
from mlx_medic.node.sweep_reply import SweepReply, survivor_verdict
from mlx_medic.processes.survivors import SurvivorVerdict
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.facts import maintainers_report
from mlx_medic.remediator.steps.on_nodes import ask, not_answered

UNREACHABLE_NEXT = (
    "the sweep could not be complete, so nothing was started: check that"
    " {nodes} is up and answers SSH, reboot it if it hangs"
)
SURVIVE = "that only a reboot of its node ends: "


def describe_processes(entries: Sequence[ProcessEntry]) -> str:
    return ", ".join(f"pid {e.pid} ({e.role}, state {e.state})" for e in entries)


def not_ours_said(reply: SweepReply) -> str:
    """`, 1 not ours (pid 4242 rank, root's: left alone)`, or "" when there is none."""
    if not reply.not_ours:
        return ""
    named = ", ".join(
        f"pid {e.pid} {e.role}, {e.owner}'s" + (", on the model's port" if e.holds_port else "")
        for e in reply.not_ours
    )
    return f", {len(reply.not_ours)} not ours ({named}: may not signal, left alone)"


def blocking_advice(verdict: SurvivorVerdict, inventory: Inventory) -> str:
    """What a survivor holding the model's port needs: `reboot NODE to free ...`, why, and
    that the service stays started (it serves once the port is free)."""
    advice = dict(zip(verdict.nodes, verdict.advice(inventory), strict=True))
    try:
        label = inventory.model(verdict.model).service.label
    except KeyError:
        label = "its service"
    first = "; ".join(advice[node] for node in verdict.reboot_nodes)
    others = [advice[node] for node in verdict.nodes if node not in verdict.reboot_nodes]
    return (
        f"{first}: a process there that survives SIGKILL holds {verdict.model}'s port,"
        f" so no start can listen on it until then; {label} is left started and serves"
        " once the port is free" + (f"; also {'; '.join(others)}" if others else "")
    )


def survivor_escalation(
    verdict: SurvivorVerdict | None,
    inventory: Inventory,
    detail: str,
    next_action: str,
    *,
    after_start: bool,
) -> tuple[str, str]:
    """An escalation's (detail, next action) for a run whose sweep left survivors: the
    detail names them, the next action carries their nodes' reboot advice. After a start
    that failed verification, a survivor holding the model's port is the reason: its reboot
    is the next action; other survivors' reboots come first (they hold protection domains
    a JACCL start needs). Before a start, the advice follows the escalation's own action.
    Unchanged without survivors; said once, however often it is applied."""
    if verdict is None or not verdict.survivors:
        return detail, next_action
    named = verdict.describe(inventory)
    if named not in detail:
        detail = f"{detail}; survivors left: {named}"
    advice = "; ".join(verdict.advice(inventory))
    if after_start and verdict.blocked:
        wanted = blocking_advice(verdict, inventory)
        return detail, next_action if next_action.startswith(wanted) else wanted
    if advice in next_action:
        return detail, next_action
    if after_start:
        return detail, f"{advice}, then {next_action}"
    return detail, f"{next_action}; also {advice}"


@dataclass(frozen=True, kw_only=True)
class Sweep(Step):
    """`node sweep MODEL` on `nodes` (every node of the model by default); with
    `orphans_only`, only what the exporter's rules call orphans. Unkillable survivors end
    it ok, named with their reboot advice (in `StepResult.survivors`); see the module."""

    model: Model
    nodes: tuple[str, ...] = ()
    orphans_only: bool = False

    @property
    def on(self) -> list[str]:
        return list(self.nodes or self.model.nodes)

    def describe(self) -> StepDescription:
        model = self.model
        what = (
            "the orphans (by the exporter's rules; never suspects or the current run)"
            if self.orphans_only
            else "every process in the model's scope"
        )
        after = (
            "named once with the node to reboot, and the model keeps serving"
            if self.orphans_only
            else "named with the node to reboot, and the start goes on around them (one"
            f" holding :{model.port} makes the start fail until that reboot)"
        )
        return StepDescription(
            "sweep-orphans" if self.orphans_only else "sweep",
            ", ".join(self.on),
            f"end {what} of {model.name} on {', '.join(self.on)}, whatever its parent:"
            f" SIGTERM, {model.policy.kill_grace:g}s grace, then SIGKILL"
            f"{'' if model.policy.sigkill else ' (not allowed by policy)'}; never a :{model.port}"
            " listener that answers the health probe; what survives SIGKILL (state D/U) is"
            f" {after}",
            targets=[f"{model.name} on {node}" for node in self.on],
        )

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        args = ["--orphans-only"] if self.orphans_only else []
        timeout = context.node_helpers.timeout + model.policy.kill_grace
        replies = await ask(context, self.on, SweepReply, model.name, *args, timeout=timeout)
        unanswered = not_answered(replies, "the sweep", UNREACHABLE_NEXT)
        if unanswered is not None:
            return unanswered
        output = replies.output()
        swept = {node: reply.answer for node, reply in replies.replies.items()}
        # node -> (pid, start time) of what its sweep found unkillable (empty: none)
        identities = {
            node: [(s.pid, s.start_time) for s in sweep.unkillable] for node, sweep in swept.items()
        }
        verdict = survivor_verdict(model.name, swept.values())
        known = 0
        if self.orphans_only:  # named once: an earlier run found them and said so
            fresh = [s for s in verdict.survivors if s.identity not in context.known_unkillable]
            known = len(verdict.survivors) - len(fresh)
            verdict = SurvivorVerdict(model.name, fresh)
        named = verdict if verdict.survivors else None
        report = (
            ". " + await maintainers_report(context, verdict.nodes) if verdict.survivors else ""
        )
        killable = {node: sweep.killable for node, sweep in swept.items()}
        failed = [
            node
            for node, reply in replies.replies.items()
            if killable[node] or (not reply.ok and not swept[node].unkillable)
        ]
        if failed:
            reasons = "; ".join(
                f"{node}: {describe_processes(killable[node])} survived the sweep, not in"
                " uninterruptible sleep"
                if killable[node]
                else replies.why_not(node)
                for node in failed
            )
            also = (
                f"; also {len(verdict.survivors)} survivor(s) {SURVIVE}"
                f"{verdict.describe(context.inventory)}"
                if named
                else ""
            )
            return StepResult(
                StepOutcome.FAILED,
                output=output,
                unkillable=identities,
                survivors=named,
                detail=f"survivors after the sweep: {reasons}{also}{report}",
            )
        counts = []
        for node, sweep in swept.items():
            counts.append(
                f"{node}: {len(sweep.signalled)} signalled, {len(sweep.spared)} spared,"
                f" {sweep.pd_spent} PD spent{not_ours_said(sweep)}"
            )
        if known:
            counts.append(f"{known} unkillable process(es) an earlier run named, left alone")
        detail, next_action = "; ".join(counts), None
        if named is not None:
            detail += f". {self._survivors_said(named, context.inventory)}"
            if named.blocked and not self.orphans_only:
                next_action = blocking_advice(named, context.inventory)
            detail += report
        return StepResult(
            StepOutcome.OK,
            detail=detail,
            output=output,
            unkillable=identities,
            survivors=named,
            next_action=next_action,
        )

    def _survivors_said(self, verdict: SurvivorVerdict, inventory: Inventory) -> str:
        said = f"{len(verdict.survivors)} survivor(s) {SURVIVE}{verdict.describe(inventory)}"
        if self.orphans_only:
            return (
                f"{said}; the model keeps serving (the node's exporter pages"
                " MLXUnkillableSurvivors until the reboot)"
            )
        if not verdict.blocked:
            return f"{said}; the start goes on around them"
        nodes = ", ".join(verdict.reboot_nodes)
        advice = dict(zip(verdict.nodes, verdict.advice(inventory), strict=True))
        return (
            f"{said}. One holds {verdict.model}'s port, so no start can listen there until"
            f" {nodes} reboots; the start goes on anyway (a survivor never leaves the"
            " service stopped: the serve wrapper keeps trying and names the reboot in its"
            " error and serve record), so its verify fails until then; next action: "
            + "; ".join(advice[node] for node in verdict.reboot_nodes)
        )
