"""The last step of a recovery: every backend failed, so a person must look."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory import Model
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult


@dataclass(frozen=True, kw_only=True)
class Escalate(Step):
    model: Model

    def describe(self) -> StepDescription:
        return StepDescription(
            "escalate", self.model.head, "every backend failed verification: page on-call"
        )

    async def run(self, context: RunContext) -> StepResult:
        nodes = ", ".join(self.model.nodes)
        return StepResult(
            StepOutcome.OK,
            detail="every backend failed verification",
            unrecoverable=True,
            next_action=(
                f"stop every rank of {self.model.name}, check the Thunderbolt links"
                f" (`ibv_devinfo`: PORT_ACTIVE), reboot all its nodes ({nodes})"
            ),
        )
