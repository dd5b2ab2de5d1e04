"""`recover`: the seed incident's order for a model that is down."""

from __future__ import annotations

from mlx_medic.inventory import Inventory, Model
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
    fall back with: a failed verify escalates, saying so."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        steps: list[Step] = [Preflight(model=model), StopService(model=model), Sweep(model=model)]
        if model.scope_dirs():  # tmp_dirs and cache_dirs alike, as the exporter weighs them
            steps.append(CleanTmp(model=model))
        steps += [StartService(model=model), Verify(model=model)]
        wrapper = model.service.kind == "wrapper"
        if wrapper and model.backends.jaccl is not None and model.backends.ring is not None:
            steps += [PinRing(model=model, fallback=True),
                      StartService(model=model, action="restart", fallback=True),
                      Verify(model=model, backend="ring", fallback=True)]  # fmt: skip
        steps.append(Escalate(model=model, fallback=True))
        return steps

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return await recheck_model_down(context)
