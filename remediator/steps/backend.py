"""The fallback: after a failed verify that shows a JACCL failure, pin the model's
backend to ring on its head (`mlx-medic node backend MODEL set ring`), so the serve
wrapper starts the ring backend with `--pipeline` from then on.

Why only on a JACCL failure: a ring pin does not fix anything else, and it is durable
(back to JACCL only by `mlx-medic backend MODEL auto`). The evidence is the head's
`facts`: the serve wrapper's record of a failed JACCL start, or a JACCL error signature
in the service log; the exact line goes into the pin's reason and the journal. When the
run's sweep left a survivor holding the model's port, no backend can listen there: no pin
is made, and the run escalates with that node's reboot as the next action.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.node.replies import BackendReply
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.facts import maintainers_report, read_facts
from mlx_medic.remediator.steps.on_nodes import ask, not_answered, one_reply
from mlx_medic.remediator.steps.service import HEAD_UNREACHABLE
from mlx_medic.remediator.steps.sweep import blocking_advice


@dataclass(frozen=True, kw_only=True)
class PinRing(Step):
    model: Model

    def describe(self) -> StepDescription:
        head = self.model.head
        return StepDescription(
            "pin-ring",
            head,
            f"if {head}'s service log or serve record shows a JACCL failure, pin"
            f" {self.model.name} to the ring backend (with --pipeline) on {head}; never"
            " while a process that survives SIGKILL holds the model's port",
            targets=[f"backend choice of {self.model.name} on {head}"],
        )

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        head = model.head
        survivors = context.survivors
        if survivors is not None and survivors.blocked:
            return StepResult(
                StepOutcome.FAILED,
                unrecoverable=True,
                detail=f"{model.name} did not answer after its start: a process that survives"
                f" SIGKILL holds its port on {', '.join(survivors.reboot_nodes)}, so no"
                " backend can listen there and no pin was made",
                next_action=blocking_advice(survivors, context.inventory),
            )
        facts_replies = await ask(context, [head], FactsReply, model.name)
        unanswered = not_answered(facts_replies, "`facts`", HEAD_UNREACHABLE)
        if unanswered is not None:
            return unanswered
        facts = read_facts(facts_replies)[head]
        failure = facts.jaccl_failure()
        if failure is None or model.backends.ring is None:
            why = (
                "neither the service log nor the serve wrapper's record shows a JACCL"
                " failure, so a ring pin would not help"
                if failure is None
                else f"{model.name} has no ring backend in the inventory"
            )
            report = await maintainers_report(context, list(model.nodes))
            return StepResult(
                StepOutcome.FAILED,
                output=facts_replies.output(),
                unrecoverable=True,
                detail=f"{model.name} did not answer after its start; {why}. {report}",
                next_action=f"read {model.name}'s service log on {head} and recover by hand",
            )
        reason = f"JACCL failed on {failure.host}: {failure.line}"[:500]
        replies = await ask(
            context,
            [head],
            BackendReply,
            model.name,
            "set",
            "ring",
            "--by",
            context.by,
            "--reason",
            reason,
        )
        unanswered = not_answered(replies, "`backend set ring`", HEAD_UNREACHABLE)
        if unanswered is not None:
            return unanswered
        reply = one_reply(replies)
        output = facts_replies.output() + "\n" + replies.output()
        if not reply.ok:
            return StepResult(
                StepOutcome.FAILED,
                output=output,
                detail=f"could not pin ring: {replies.why_not(head)}",
            )
        return StepResult(
            StepOutcome.OK, output=output, detail=f"pinned {model.name} to ring on {head}: {reason}"
        )
