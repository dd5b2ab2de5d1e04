"""`recover`: the seed incident's order for a model that is down."""

from __future__ import annotations

from mlx_medic.inventory import Inventory, Model
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict, recheck_model_down
from mlx_medic.remediator.steps import (
    CleanTmp,
    Escalate,
    RunContext,
    StartService,
    Step,
    StopService,
    Sweep,
    Verify,
)


class RecoverPlaybook(Playbook):
    """Stop the service, sweep every node, clean tmp dirs, start on JACCL, verify, fall
    back to ring with --pipeline, escalate."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        steps: list[Step] = [StopService(model=model)]
        steps += [Sweep(model=model, node=node) for node in model.nodes]
        if model.scope_dirs():  # tmp_dirs and cache_dirs alike, as the exporter weighs them
            steps += [CleanTmp(model=model, node=node) for node in model.nodes]
        for index, (backend, _spec) in enumerate(model.backends.in_order()):
            fallback = index > 0
            if fallback:
                steps.append(StopService(model=model, before_backend=backend, fallback=True))
            steps.append(StartService(model=model, backend=backend, fallback=fallback))
            steps.append(Verify(model=model, backend=backend, fallback=fallback))
        steps.append(Escalate(model=model, fallback=True))
        return steps

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return await recheck_model_down(context)
