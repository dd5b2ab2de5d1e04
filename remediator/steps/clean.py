"""Remove a model's stale tmp entries on every node at once, after the sweep, through
`mlx-medic node clean` (the exporter's staleness rule: no symlink followed, nothing in
use, nothing outside the configured dirs). Another user's entry the node's login user may
not remove is in the helper's `not_ours`, named here with its owner, never a failure."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.node.replies import CleanReply
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.on_nodes import ask, not_done


def not_ours_said(reply: CleanReply) -> str:
    """`, 1 not ours (/tmp/tmp.x, root's: left whole)`, or "" when there is none."""
    if not reply.not_ours:
        return ""
    named = ", ".join(f"{e.path}, {e.owner}'s" for e in reply.not_ours)
    return f", {len(reply.not_ours)} not ours ({named}: may not remove, left whole)"


@dataclass(frozen=True, kw_only=True)
class CleanTmp(Step):
    model: Model

    def describe(self) -> StepDescription:
        nodes = ", ".join(self.model.nodes)
        return StepDescription(
            "clean-tmp",
            nodes,
            f"remove stale tmp* entries of {self.model.name} on {nodes}, after the sweep",
            targets=[f"{d}/tmp*" for d in self.model.scope_dirs()],
        )

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        replies = await ask(context, model.nodes, CleanReply, model.name)
        problem = not_done(
            replies, "the clean", "check that {nodes} is up and answers SSH; nothing was started"
        )
        if problem is not None:
            return problem
        freed = []
        for node, reply in replies.replies.items():
            clean = reply.answer
            freed.append(
                f"{node}: {len(clean.removed)} removed, {clean.bytes_freed} bytes freed"
                f"{not_ours_said(clean)}"
            )
        return StepResult(StepOutcome.OK, detail="; ".join(freed), output=replies.output())
