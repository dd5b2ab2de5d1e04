"""`sweep-orphans`: remove the orphans a node reports while the model still serves.

Routed from the orphan alert, which names the node (the exporter's `node` label): the
cascade is stopped while the model still answers, before the protection domains run out.
The reporting nodes are swept first, then the model's other nodes (a crash's orphans
span them), and only what the exporter's rules call orphans (`node sweep MODEL
--orphans-only`): the service is not stopped, the current run and suspects are not
touched. The verify checks that a model that answered before still answers; one that was
not answering (a start or a crash in progress) is left to LLMModelDown. Before that
verify, the run confirms its nodes clean (`ConfirmClean`): two checks at least
`orphans_clean_window` apart that find no orphan, so Prometheus has seen zero and the
alert (the firing this run holds) resolves; orphans that come back meanwhile (another
crash) are swept and the checks start over, and after 3 such re-sweeps the run escalates.
An orphan that survives SIGKILL (uninterruptible: only a reboot of its node ends it)
is no failure and no escalation: the sweep names it once, with its node's reboot advice
(the step's detail, the run's and a journal `unkillable` event, a warning), and the
node's exporter pages `MLXUnkillableSurvivors` for the reboot; the model keeps serving. Orphans an
earlier run named are not named again, nor a reason to act again (the re-check leaves
them out). It has its own budget and never opens the model's circuit, so routine sweeps
cannot stop `recover`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.replies import OrphansReply
from mlx_medic.remediator.model_health import ModelState
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict
from mlx_medic.remediator.steps import RunContext, Step, Sweep, Verify
from mlx_medic.remediator.steps.confirm_clean import (
    DEFAULT_CLEAN_WINDOW,
    HEALTH_POLL,
    ConfirmClean,
    Sleep,
)
from mlx_medic.remediator.steps.on_nodes import ask

SWEEP_ORPHANS = "sweep-orphans"


class SweepOrphansPlaybook(Playbook):
    while_up = True
    own_budget = True
    per_node = True

    def __init__(
        self,
        clean_window: float = DEFAULT_CLEAN_WINDOW,
        sleep: Sleep = asyncio.sleep,
        health_poll: float = HEALTH_POLL,
    ) -> None:
        """`clean_window`: the config's `orphans_clean_window` (ConfirmClean's window);
        `sleep`: how ConfirmClean waits it (a test's clock); `health_poll`: how often it
        probes a serving model meanwhile."""
        self.clean_window = clean_window
        self.sleep = sleep
        self.health_poll = health_poll

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return self.plan_for(model, inventory, ())

    def plan_for(self, model: Model, inventory: Inventory, nodes: Sequence[str]) -> list[Step]:
        """Sweep the orphans of the reporting nodes (every node of the model when no alert
        named one), then those of the model's other nodes, then confirm every node clean in
        two checks `clean_window` apart (re-sweeping orphans that come back), then check
        that a model that answered still answers: one probe, no restart.

        A crash leaves orphans on several nodes, and a peer's rank often counts as one only
        once the head's leftovers of the dead launch (its `ssh` clients) are gone; waiting
        for the peer's own alert can cost the seconds in which that rank is still
        killable (seed 000: orphans slide into `Us+`), so the other nodes are swept right
        after, orphans only."""
        named = tuple(nodes)
        steps: list[Step] = [Sweep(model=model, nodes=named, orphans_only=True)]
        others = tuple(node for node in model.nodes if node not in named) if named else ()
        if others:
            steps.append(Sweep(model=model, nodes=others, orphans_only=True))
        steps.append(
            ConfirmClean(
                model=model,
                window=self.clean_window,
                sleep=self.sleep,
                health_poll=self.health_poll,
            )
        )
        steps.append(Verify(model=model, within=0, only_if_answered_before=True))
        return steps

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        """Act while the reporting nodes still report orphans other than ones an earlier
        run found unkillable (and named)."""
        model = context.model
        nodes = list(context.nodes or model.nodes)
        # the model's health is asked beside the orphans, not after them: one round trip
        # less before the sweep, while the orphans may still be killable
        replies, health = await asyncio.gather(
            ask(context, nodes, OrphansReply, model.name), context.health(model)
        )
        probed = f"`mlx-medic node orphans {model.name}` on {', '.join(nodes)}, over SSH"
        if replies.errors:
            node, error = next(iter(replies.errors.items()))
            return RecheckVerdict.not_asked(
                f"could not ask {node} for its orphans: {error}", node, error, probed=probed
            )
        fresh, known = [], 0
        for node, reply in replies.replies.items():
            for orphan in reply.answer.orphans:
                if (node, *orphan.identity) in context.known_unkillable:
                    known += 1
                else:
                    fresh.append(f"{node} pid {orphan.pid} ({orphan.rule or '?'})")
        if fresh:
            context.answered_before = health.state is ModelState.UP
            return RecheckVerdict.act(
                f"orphans of {model.name} still reported: {', '.join(fresh)}", probed=probed
            )
        also = f" (only {known} an earlier run found unkillable and named)" if known else ""
        return RecheckVerdict.skip(
            f"no orphans of {model.name} left on {', '.join(nodes)}{also}", probed=probed
        )
