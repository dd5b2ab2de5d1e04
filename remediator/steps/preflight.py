"""Before anything is stopped: every node of the model answers, with its memory and RDMA
ports read.

Why first: a node that cannot be reached cannot be swept, and a restart on top of
orphans it may hold would spend more protection domains; so an unreachable node ends the
run in an escalation before the service is touched.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from mlx_medic.inventory.model import Model
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.facts import read_facts
from mlx_medic.remediator.steps.on_nodes import NodeReplies, ask, not_done


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"


@dataclass(frozen=True, kw_only=True)
class Preflight(Step):
    read_only = True
    model: Model

    def describe(self) -> StepDescription:
        nodes = self.model.nodes
        return StepDescription(
            "preflight",
            ", ".join(nodes),
            f"every node of {self.model.name} answers `mlx-medic node facts` (memory, RDMA"
            " ports) before anything is stopped (asked while the run takes the model lock);"
            " an unreachable node escalates",
            targets=list(nodes),
        )

    def read_ahead(self, context: RunContext) -> Coroutine[Any, Any, NodeReplies[FactsReply]]:
        """The facts are only read: asked while the run re-checks and takes the lock."""
        return ask(context, self.model.nodes, FactsReply, self.model.name)

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        ahead = context.take_read_ahead()
        replies: NodeReplies[FactsReply] = await (
            ahead if ahead is not None else self.read_ahead(context)
        )
        problem = not_done(
            replies,
            "the preflight",
            f"nothing was stopped or restarted: the sweep of {model.name} could not be"
            " complete. Check that {nodes} is up and answers SSH, reboot it if it hangs",
        )
        if problem is not None:
            return problem
        notes = []
        for node, facts in read_facts(replies).items():
            line = f"{node}: memory {_gib(facts.memory_available)} free"
            inactive, unknown = facts.inactive_ports, facts.unknown_ports
            active = len(facts.rdma_ports) - len(inactive) - len(unknown)
            if inactive:
                line += f", RDMA ports not active: {', '.join(inactive)}"
            elif active:
                line += f", {active} RDMA port(s) active"
            if unknown:
                line += f", RDMA port(s) of unknown state: {', '.join(unknown)}"
            notes.append(line)
        return StepResult(StepOutcome.OK, detail="; ".join(notes), output=replies.output())
