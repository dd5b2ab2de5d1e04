"""Remove a model's stale tmp dirs from one node, after the sweep."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory import Model
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult


@dataclass(frozen=True, kw_only=True)
class CleanTmp(Step):
    model: Model
    node: str

    def describe(self) -> StepDescription:
        return StepDescription(
            "clean-tmp", self.node,
            f"remove stale tmp* dirs of {self.model.name} on {self.node}, after the sweep",
            targets=[f"{d}/tmp*" for d in self.model.scope_dirs()],
        )

    async def run(self, context: RunContext) -> StepResult:
        return self.not_implemented()
