"""Stop and start the model's service with its service manager's own commands."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory import BackendName, Model
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.service_manager import service_argv


@dataclass(frozen=True, kw_only=True)
class StopService(Step):
    """Stop the service on the head, so it cannot respawn ranks while nodes are swept."""

    model: Model
    before_backend: BackendName | None = None  # set when stopping again for a fallback

    def describe(self) -> StepDescription:
        service = self.model.service
        if self.before_backend is None:
            text = (
                f"stop {service.manager} service {service.label} so it cannot respawn"
                " ranks during the sweep"
            )
        else:
            text = f"stop the service again before falling back to {self.before_backend}"
        return StepDescription(
            "stop-service",
            self.model.head,
            text,
            targets=[service.label],
            argv=service_argv(self.model, "stop"),
        )

    async def run(self, context: RunContext) -> StepResult:
        return self.not_implemented()


@dataclass(frozen=True, kw_only=True)
class StartService(Step):
    """Start the service on one backend (JACCL, or ring with --pipeline)."""

    model: Model
    backend: BackendName

    def describe(self) -> StepDescription:
        spec = dict(self.model.backends.in_order())[self.backend]
        split = " with --pipeline" if spec.pipeline else ""
        return StepDescription(
            f"start-{self.backend}",
            self.model.head,
            f"start {self.model.name} on {self.backend} (hostfile {spec.hostfile}){split}",
            targets=[self.model.service.label, str(spec.hostfile)],
            argv=service_argv(self.model, "start"),
        )

    async def run(self, context: RunContext) -> StepResult:
        return self.not_implemented()
