"""The last step of a recovery: nothing the remediator may do made the model answer, so
a person must look. It names the nodes and carries what upstream maintainers ask for:
OS build, MLX and mlx-lm versions, the exact error line and its host (`node facts`).
When the run's sweep left survivors (uninterruptible: only a reboot ends them), it names
them and carries their nodes' reboot advice; one holding the model's port makes that
reboot the next action (`steps.sweep.survivor_escalation`)."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import RunContext, Step, StepDescription, StepResult
from mlx_medic.remediator.steps.facts import maintainers_report
from mlx_medic.remediator.steps.sweep import survivor_escalation


@dataclass(frozen=True, kw_only=True)
class Escalate(Step):
    model: Model

    def describe(self) -> StepDescription:
        if self.model.service.kind == "script":
            text = (
                "the start failed verification and the model runs its own start script"
                " (a backend pin changes nothing there): page on-call"
            )
        else:
            text = "every backend failed verification: page on-call"
        text += (
            " with what maintainers ask for (and, if the sweep left survivors, each"
            " with the node to reboot for it)"
        )
        return StepDescription("escalate", self.model.head, text, targets=list(self.model.nodes))

    async def run(self, context: RunContext) -> StepResult:
        model = self.model
        nodes = ", ".join(model.nodes)
        report = await maintainers_report(context, list(model.nodes))
        if model.service.kind == "script":
            detail = (
                f"{model.name} did not answer after its start script ran; it starts its"
                " ranks itself, so a backend pin changes nothing: change its script (to"
                f" ring with --pipeline, if JACCL failed) by hand. {report}"
            )
        else:
            detail = f"every backend of {model.name} failed verification. {report}"
        detail, next_action = survivor_escalation(
            context.survivors,
            context.inventory,
            detail,
            f"stop every rank of {model.name}, check the Thunderbolt links"
            f" (`ibv_devinfo`: PORT_ACTIVE), reboot all its nodes ({nodes})",
            after_start=True,
        )
        return StepResult(
            StepOutcome.OK, detail=detail, unrecoverable=True, next_action=next_action
        )
