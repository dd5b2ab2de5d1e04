"""What `mlx-medic node facts MODEL` tells about the nodes, as the playbook reads it
(mlx_medic.node.facts_reply.FactsReply: memory, RDMA ports, versions, the service log's
errors and the serve wrapper's record), and what maintainers ask for in upstream issues
(OS build, MLX and mlx-lm versions, the exact error line, which host), which every
escalation carries.
"""

from __future__ import annotations

from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.remediator.steps.base import RunContext
from mlx_medic.remediator.steps.on_nodes import NodeReplies, ask


def read_facts(replies: NodeReplies[FactsReply]) -> dict[str, FactsReply]:
    """The facts of every node that answered with a document (its exit status aside)."""
    return {node: reply.answer for node, reply in replies.replies.items()}


def for_maintainers(facts: dict[str, FactsReply], unanswered: list[str] | None = None) -> str:
    """What upstream maintainers ask for: each node's OS build and versions, and the exact
    error line with its host."""
    lines = [f.summary() for f in facts.values()]
    errors = [e for f in facts.values() if (e := f.jaccl_failure() or f.first_error())]
    lines += [f"error on {e.host}: {e.line}" for e in errors]
    lines += [f"{node}: no facts (did not answer)" for node in unanswered or []]
    return "; ".join(lines)


async def maintainers_report(context: RunContext, nodes: list[str]) -> str:
    """Ask `facts` on the nodes (at once) and say what maintainers ask for; a node that
    does not answer is named, never waited on past the helpers' timeout."""
    replies = await ask(context, nodes, FactsReply, context.model.name)
    return for_maintainers(read_facts(replies), list(replies.errors))
