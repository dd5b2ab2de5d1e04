"""`recover`: the seed incident's order for a model that is down: stop, sweep (what
survives SIGKILL is named, and the start goes on around it), clean, start, verify."""

from __future__ import annotations

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict, recheck_model_down
from mlx_medic.remediator.steps import (
    CleanTmp,
    Escalate,
    PinRing,
    Preflight,
    RunContext,
    StartService,
    Step,
    StopService,
    Sweep,
    Verify,
)


class RecoverPlaybook(Playbook):
    """Preflight every node, stop the service, sweep every node, clean, start (the serve
    wrapper chooses the backend), verify; after a failed verify that shows a JACCL failure,
    pin ring, restart, verify; escalate.

    A model whose service is its own start script (`service.kind: script`) has no pin to
    fall back with: a failed verify escalates, saying so.

    What the sweep cannot end (uninterruptible sleep: only a reboot of its node ends it)
    never leaves the service stopped: the sweep names it with its node's reboot advice and
    the run starts and verifies anyway, as the seed's own fix did ("those already in Us+
    survive but stop accumulating"). A verified run succeeds naming the survivors left; one
    holding the model's port makes the verify fail, and the run escalates with "reboot
    NODE ..." as the next action (no ring pin: no backend can listen on a held port). A
    survivor the sweep could have ended (not uninterruptible) or a node that does not
    answer still escalates with the service stopped."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        steps: list[Step] = [Preflight(model=model), StopService(model=model), Sweep(model=model)]
        if model.scope_dirs():  # tmp_dirs and cache_dirs alike, as the exporter weighs them
            steps.append(CleanTmp(model=model))
        steps += [StartService(model=model), Verify(model=model)]
        wrapper = model.service.kind == "wrapper"
        if wrapper and model.backends.jaccl is not None and model.backends.ring is not None:
            steps += [
                PinRing(model=model, fallback=True),
                StartService(model=model, action="restart", fallback=True),
                Verify(model=model, backend="ring", fallback=True),
            ]
        steps.append(Escalate(model=model, fallback=True))
        return steps

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return await recheck_model_down(context)
