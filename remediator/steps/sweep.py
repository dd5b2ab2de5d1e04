"""Remove a model's ranks from one node, within the model's scope."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory import Model
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult


@dataclass(frozen=True, kw_only=True)
class Sweep(Step):
    model: Model
    node: str

    def describe(self) -> StepDescription:
        model = self.model
        scope = [f"port {model.port}", *(str(d) for d in model.tmp_dirs)]
        return StepDescription(
            "sweep", self.node,
            f"kill {model.name} ranks on {self.node} (scope: {', '.join(scope)});"
            f" never the :{model.port} listener",
            targets=[f"{model.name} ranks on {self.node}"],
        )

    async def run(self, context: RunContext) -> StepResult:
        return self.not_implemented()
