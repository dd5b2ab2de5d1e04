"""What every acting step shares: one helper call per node (nodes at once, each with the
helpers' timeout), its replies as the journal's output, and the nodes that did not answer.

Why one place: every step must tell "the node said no" (the helper's exit status and
document) from "the node could not be asked" (unreachable, timed out, no document), and
journal what each node answered in one shape, so on-call reads every step alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic

from mlx_medic.node.client import (
    HelperCallError,
    HelperMisconfigured,
    HelperReply,
    HelperTimedOut,
    R,
)
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, StepResult


@dataclass
class NodeReplies(Generic[R]):
    """One helper's answers from a set of nodes, in the order asked, each read as its
    reply type (`reply.answer`)."""

    helper: str
    replies: dict[str, HelperReply[R]] = field(default_factory=dict)
    errors: dict[str, HelperCallError] = field(default_factory=dict)

    @property
    def unreachable(self) -> list[str]:
        return [node for node, error in self.errors.items() if error.unreachable]

    @property
    def timed_out(self) -> list[HelperTimedOut]:
        """The calls that gave no answer within their limit (each names its node,
        helper and limit)."""
        return [error for error in self.errors.values() if isinstance(error, HelperTimedOut)]

    @property
    def misconfigured(self) -> list[Misconfiguration]:
        """What is wrong with the nodes whose mlx-medic could not serve the call."""
        return [
            error.misconfiguration
            for error in self.errors.values()
            if isinstance(error, HelperMisconfigured)
        ]

    @property
    def failed(self) -> list[str]:
        """Nodes whose helper answered that it could not do its job."""
        return [node for node, reply in self.replies.items() if not reply.ok]

    def output(self) -> str:
        """The journal's output: one JSON line per node, its document or why it has none."""
        lines = []
        for node, reply in self.replies.items():
            lines.append(
                json.dumps(
                    {
                        "node": node,
                        "argv": reply.argv,
                        "exit_status": reply.exit_status,
                        "document": reply.document,
                        "stderr": reply.stderr[-2000:],
                    },
                    sort_keys=True,
                )
            )
        for node, error in self.errors.items():
            entry = {
                "node": node,
                "error": str(error),
                "unreachable": error.unreachable,
                "timed_out": error.timed_out,
            }
            lines.append(json.dumps(entry, sort_keys=True))
        return "\n".join(lines)

    def why_not(self, node: str) -> str:
        """Why the node gave no usable answer, in a few words."""
        if node in self.errors:
            return str(self.errors[node])
        reply = self.replies[node]
        said = reply.stderr.strip().splitlines()[-1:] or [f"exit {reply.exit_status}"]
        return f"{node}: mlx-medic node {self.helper}: {said[0][:300]}"


async def ask(
    context: RunContext,
    nodes: Sequence[str],
    kind: type[R],
    *args: str,
    timeout: float | None = None,
) -> NodeReplies[R]:
    """The helper of reply type `kind` on every node at once; each node's reply or why
    there is none (a document that cannot be read as `kind` is one of those)."""
    answers = await context.node_helpers.on_nodes(list(nodes), kind, *args, timeout=timeout)
    replies: NodeReplies[R] = NodeReplies(kind.helper)
    for node, answer in answers.items():
        if isinstance(answer, HelperCallError):
            replies.errors[node] = answer
        else:
            replies.replies[node] = answer
    return replies


def not_answered(replies: NodeReplies[R], what: str, next_action: str) -> StepResult | None:
    """The step's result when a node could not be asked (unreachable, timed out,
    misconfigured or no document): a run cannot act on what it cannot see, so it escalates
    (`unrecoverable`, or ends misconfigured before any step acted: the runner's) and names
    the nodes; None when every node answered."""
    if not replies.errors:
        return None
    nodes = list(replies.errors)
    unreachable = replies.unreachable
    misconfigured = replies.misconfigured
    reasons = "; ".join(replies.why_not(node) for node in nodes)
    if unreachable:
        outcome, said = StepOutcome.UNREACHABLE, "did not answer"
        action = next_action.format(nodes=", ".join(nodes))
    elif timed_out := replies.timed_out:  # asked, and still working (or hung) at the limit
        outcome, said = StepOutcome.FAILED, "timed out in"
        action = "; ".join(
            f"`mlx-medic node {error.helper}` on {error.node} gave no answer within"
            f" {error.limit:g}s and ends itself (and what it started) at that limit: find"
            f" what it hung on there (a disk, mount or device that does not answer)"
            " before the model is resumed"
            for error in timed_out
        )
    elif misconfigured:  # the node answered: its mlx-medic is deployed wrong, one fix each
        outcome, said = StepOutcome.FAILED, "cannot serve, as deployed,"
        action = "; ".join(found.fix for found in misconfigured)
    else:  # it answered, but not as the helper: a missing helper, a bad inventory path,
        # a document its reply type cannot read
        outcome, said = StepOutcome.FAILED, "gave no helper document for"
        action = (
            f"run `mlx-medic node {replies.helper}` on {', '.join(nodes)} by hand and"
            " fix what it says (the step's output has its stderr)"
        )
    return StepResult(
        outcome,
        detail=f"{', '.join(nodes)} {said} {what}: {reasons}",
        output=replies.output(),
        unrecoverable=True,
        unreachable=tuple(unreachable),
        next_action=action,
        misconfigured=tuple(misconfigured),
    )


def failed_on(replies: NodeReplies[R], what: str) -> StepResult | None:
    """The step's result when a helper answered that it could not do its job; else None."""
    if not replies.failed:
        return None
    reasons = "; ".join(replies.why_not(node) for node in replies.failed)
    return StepResult(StepOutcome.FAILED, detail=f"{what}: {reasons}", output=replies.output())


def not_done(replies: NodeReplies[R], what: str, next_action: str) -> StepResult | None:
    """A node could not be asked (escalate), or its helper could not do its job (fail);
    None when every node did what it was asked."""
    return not_answered(replies, what, next_action) or failed_on(replies, f"{what} failed")


def one_reply(replies: NodeReplies[R]) -> HelperReply[R]:
    (reply,) = replies.replies.values()
    return reply
