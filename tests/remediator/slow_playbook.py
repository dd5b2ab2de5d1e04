"""Test playbooks for the real service (`service_with_test_playbooks` registers them):
a run that lasts long enough to be killed in the middle, and a quick one that "recovers"."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks import Playbook, RecheckVerdict, recheck_model_down
from mlx_medic.remediator.steps import (
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
    StopService,
    Verify,
)


@dataclass(frozen=True, kw_only=True)
class Hold(Step):
    """Holds the model (and its lock) for `seconds`."""

    model: Model
    seconds: float

    def describe(self) -> StepDescription:
        return StepDescription(
            "hold",
            self.model.head,
            f"hold {self.model.name} for {self.seconds:g}s",
            targets=[self.model.name],
        )

    async def run(self, context: RunContext) -> StepResult:
        await asyncio.sleep(self.seconds)
        return StepResult(StepOutcome.OK, detail=f"held {self.seconds:g}s", output="held")


@dataclass(frozen=True, kw_only=True)
class ClaimsRecovery(Step):
    """A verify that says the model is serving again, though it falls over again."""

    kind: ClassVar[StepKind] = StepKind.VERIFY
    model: Model

    def describe(self) -> StepDescription:
        return StepDescription("verify", self.model.head, f"claims {self.model.name} is up")

    async def run(self, context: RunContext) -> StepResult:
        return StepResult(StepOutcome.OK, detail="restarted (and it will fall over again)")


class SlowPlaybook(Playbook):
    """Holds the model for `hold_seconds` in a step of its own, then verifies."""

    def __init__(self, hold_seconds: float = 60.0) -> None:
        self.hold_seconds = hold_seconds

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        backend = model.backends.in_order()[0][0]
        return [
            Hold(model=model, seconds=self.hold_seconds),
            Verify(model=model, backend=backend, within=0),
        ]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return await recheck_model_down(context)


class StopThenHoldPlaybook(SlowPlaybook):
    """Stops the service for real (`node service MODEL stop`), then holds: the remediator can
    be killed right after its stop. Acts whatever the model's health."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [StopService(model=model), *super().plan(model, inventory)]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return RecheckVerdict.act("a test stops the service")


class QuickRecoveringPlaybook(SlowPlaybook):
    """Acts briefly and reports the model healthy, though it falls over again: the
    restart loop the budget exists for. Each run succeeds and spends budget."""

    def __init__(self) -> None:
        super().__init__(hold_seconds=0.1)

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [Hold(model=model, seconds=self.hold_seconds), ClaimsRecovery(model=model)]


def slow_playbooks() -> dict[str, Playbook]:
    return {
        "slow": SlowPlaybook(),
        "quick-recovering": QuickRecoveringPlaybook(),
        "stop-then-hold": StopThenHoldPlaybook(),
    }
