"""Test playbooks routed by alert name (`routing.playbooks: {X: tests.remediator.slow_playbook:Y}`):
a run that lasts long enough to be killed in the middle, and a quick one that "recovers"."""

from __future__ import annotations

import asyncio

from mlx_medic.inventory import Inventory, Model
from mlx_medic.remediator.playbook import PlannedStep, Playbook, RunContext, StepResult


class SlowPlaybook(Playbook):
    """Holds the model for `hold_seconds` in a step of its own, then verifies."""

    name = "slow"
    hold_seconds = 60.0

    def plan(self, model: Model, inventory: Inventory) -> list[PlannedStep]:
        return [
            PlannedStep("hold", model.head, f"hold {model.name} for {self.hold_seconds:g}s",
                        targets=[model.name]),
            PlannedStep("verify", model.head, f"health probe of {model.name}",
                        targets=[f"{model.host}:{model.port}"], kind="verify"),
        ]

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        if step.kind == "verify":
            healthy = await context.health_check(context.model)
            return StepResult("ok" if healthy else "failed", detail=f"healthy={healthy}")
        await asyncio.sleep(self.hold_seconds)
        return StepResult("ok", detail=f"held {self.hold_seconds:g}s", output="held")


class QuickRecoveringPlaybook(SlowPlaybook):
    """Acts briefly and reports the model healthy, though it falls over again: the
    restart loop the budget exists for. Each run succeeds and spends budget."""

    name = "quick-recovering"
    hold_seconds = 0.1

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        if step.kind == "verify":
            return StepResult("ok", detail="restarted (and it will fall over again)")
        return await super().execute(step, context)
