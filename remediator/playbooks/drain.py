"""`drain` and `undrain`: what `mlx-medic drain NODE` and `mlx-medic undrain NODE` run for
each model placed on the node, as journaled runs under the model lock.

`drain`: stop the service (the head's stop record names the drain, so a remediator that
starts meanwhile leaves it stopped rather than finishing the stop), then sweep every node
of the model, so no rank is left an orphan of the stopped service; nothing is started.
`undrain`: after the node rebooted, the recover playbook's steps (stop, sweep, clean,
start, verify, ring pin as the fallback), after the model lock, which a serve wrapper the
boot started holds while it starts; the service is stopped again first because the boot
may have started it before the drain ended.
"""

from __future__ import annotations

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook
from mlx_medic.remediator.steps import RunContext, Step, StopService, Sweep

DRAIN = "drain"
UNDRAIN = "undrain"


class DrainPlaybook(Playbook):
    """Stop the service with the drain as the reason, then sweep every node of the model."""

    leaves_stopped = True

    def __init__(self, node: str) -> None:
        self.node = node

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        reason = f"drain of {self.node}: stop {model.name} until {self.node} has rebooted"
        return [StopService(model=model, reason=reason), Sweep(model=model)]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return RecheckVerdict.act(f"a person drains {self.node}")


class UndrainPlaybook(RecoverPlaybook):
    """The recover playbook's steps, acted on at once: a person ended the drain. The
    node's boot may have started a serve wrapper, which holds the model lock while it
    starts: the run waits for it."""

    waits_for_start = True

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return RecheckVerdict.act("a person ends the drain")
