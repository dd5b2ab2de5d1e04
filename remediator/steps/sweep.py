"""End the model's processes on every node at once, through `mlx-medic node sweep`.

Why every node, whatever the parent: the seed's orphans are ranks whose launcher died,
often parented by sshd on a peer. The helper finds them by the model's scope, checks
each identity again before signalling, spares a listener that serves, and reports a
survivor in uninterruptible sleep as unkillable: only a reboot of that node clears it,
so nothing may be started on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory import Model
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.facts import maintainers_report
from mlx_medic.remediator.steps.on_nodes import (
    NodeReplies,
    ask,
    document_list,
    failed_on,
    not_answered,
)

UNREACHABLE_NEXT = ("the sweep could not be complete, so nothing was started: check that"
                    " {nodes} is up and answers SSH, reboot it if it hangs")  # fmt: skip


def unkillable_by_node(replies: NodeReplies) -> dict[str, list[dict]]:
    """Node -> the processes its sweep found unkillable (state D: reboot the node), for
    every node that answered (an empty list: none)."""
    return {node: document_list(reply.document, "unkillable")
            for node, reply in replies.replies.items()}  # fmt: skip


def identity(entry: dict) -> tuple[int, float]:
    """A process as the sweep names it: pid and start time (a reused pid is another)."""
    try:
        return int(entry.get("pid", -1)), float(entry.get("start_time", 0.0))
    except (TypeError, ValueError):
        return -1, 0.0


def describe_processes(entries: list[dict]) -> str:
    return ", ".join(f"pid {e.get('pid')} ({e.get('role', '?')}, state {e.get('state', '?')})"
                     for e in entries)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Sweep(Step):
    """`node sweep MODEL` on `nodes` (every node of the model by default); with
    `orphans_only`, only what the exporter's rules call orphans."""

    model: Model
    nodes: tuple[str, ...] = ()
    orphans_only: bool = False

    @property
    def on(self) -> list[str]:
        return list(self.nodes or self.model.nodes)

    def describe(self) -> StepDescription:
        model = self.model
        what = ("the orphans (by the exporter's rules; never suspects or the current run)"
                if self.orphans_only else "every process in the model's scope")
        return StepDescription(
            "sweep-orphans" if self.orphans_only else "sweep", ", ".join(self.on),
            f"end {what} of {model.name} on {', '.join(self.on)}, whatever its parent:"
            f" SIGTERM, {model.policy.kill_grace:g}s grace, then SIGKILL"
            f"{'' if model.policy.sigkill else ' (not allowed by policy)'}; never a :{model.port}"
            " listener that answers the health probe",
            targets=[f"{model.name} on {node}" for node in self.on],
        )

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        args = ["--orphans-only"] if self.orphans_only else []
        timeout = context.node_helpers.timeout + model.policy.kill_grace
        replies = await ask(context, self.on, "sweep", model.name, *args, timeout=timeout)
        unanswered = not_answered(replies, "the sweep", UNREACHABLE_NEXT)
        if unanswered is not None:
            return unanswered
        output = replies.output()
        found = unkillable_by_node(replies)
        identities = {node: [identity(e) for e in entries] for node, entries in found.items()}
        unkillable = {node: entries for node, entries in found.items() if entries}
        if self.orphans_only:  # escalated once: an earlier run found them and said so
            unkillable = {node: new for node, entries in unkillable.items()
                          if (new := [e for e in entries if (node, *identity(e))
                                      not in context.known_unkillable])}  # fmt: skip
        if unkillable:
            where = "; ".join(f"{node}: {describe_processes(entries)}"
                              for node, entries in unkillable.items())  # fmt: skip
            nodes = ", ".join(unkillable)
            report = await maintainers_report(context, list(unkillable))
            return StepResult(
                StepOutcome.UNKILLABLE, output=output, unrecoverable=True, unkillable=identities,
                detail=f"processes of {model.name} in uninterruptible sleep survive SIGKILL"
                f" ({where}); nothing was started on top of them. {report}",
                next_action=f"reboot {nodes} (only a reboot clears a process in state D and"
                f" the protection domains it holds); nothing of {model.name} was started",
            )
        known = sum(len(entries) for entries in identities.values())
        only_known_survive = self.orphans_only and all(
            len(document_list(reply.document, "survivors")) <= len(found[node])
            for node, reply in replies.replies.items())  # fmt: skip
        failed = failed_on(replies, "survivors after the sweep")
        if failed is not None and not only_known_survive:
            failed.unkillable = identities
            return failed
        counts = []
        for node, reply in replies.replies.items():
            doc = reply.document
            counts.append(f"{node}: {len(document_list(doc, 'signalled'))} signalled,"
                          f" {len(document_list(doc, 'spared'))} spared,"
                          f" {doc.get('pd_spent', 0)} PD spent")  # fmt: skip
        if known:
            counts.append(f"{known} unkillable process(es) an earlier run escalated, left alone")
        return StepResult(StepOutcome.OK, detail="; ".join(counts), output=output,
                          unkillable=identities)
