"""Is the model serving after a start? Up, down, or could not tell, with the reason.

"Could not tell" is its own outcome (inconclusive), never "down": a probe that did not
run says nothing about the backend, so it must not trigger a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlx_medic.inventory import BackendName, Model
from mlx_medic.remediator.model_health import ModelState
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import (
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
)


@dataclass(frozen=True, kw_only=True)
class Verify(Step):
    kind: ClassVar[StepKind] = StepKind.VERIFY
    model: Model
    backend: BackendName

    def describe(self) -> StepDescription:
        where = f"{self.model.host}:{self.model.port}"
        return StepDescription(
            f"verify-{self.backend}", self.model.head,
            f"health probe {where}: a real 1-token request", targets=[where],
        )

    async def run(self, context: RunContext) -> StepResult:
        verdict = await context.health(self.model)
        match verdict.state:
            case ModelState.UP:
                return StepResult(StepOutcome.OK, detail=verdict.reason, backend=self.backend)
            case ModelState.DOWN:
                return StepResult(StepOutcome.FAILED, detail=verdict.reason)
        return StepResult(
            StepOutcome.INCONCLUSIVE,
            detail=f"could not tell whether {self.model.name} is up: {verdict.reason}",
        )
