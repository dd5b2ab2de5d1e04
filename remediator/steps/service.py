"""Stop, start and restart the model's service on its head, through `mlx-medic node
service`, which runs the service manager's own command (service_manager.service_argv), or
for supervisord with a config asks supervisord the same over its socket.

Why through the helper: it writes the head's "stopped by run X" record before it stops
the service, so a service left stopped (this remediator crashed, or gave up) is seen by
any remediator after a restart, by a replica and by `mlx-medic log`. A stop that finds
another run's record (a replica killed after its stop) journals it in its detail, the
replica's run, pid and host: this run's sweep and start then finish that work.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.node.replies import ServiceReply
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps.base import (
    RunContext,
    StartMarks,
    Step,
    StepDescription,
    StepResult,
)
from mlx_medic.remediator.steps.on_nodes import ask, not_answered, one_reply
from mlx_medic.remediator.utc_time import iso_utc
from mlx_medic.service_manager import ServiceAction, service_argv
from mlx_medic.state.service_stop import ServiceStop

HEAD_UNREACHABLE = (
    "check that {nodes} (the head) is up and answers SSH; the service's state there is unknown"
)


def left_stopped(record: ServiceStop) -> str:
    """What the head's stop record says, for the journal: who (a run names its replica's
    pid and host), since when, why."""
    return f"found it stopped by {record.run} since {iso_utc(record.at)} ({record.reason})"


def asked_over_socket(model: Model) -> str:
    """How the head runs the command for supervisord with a config and no sudo (node
    service_cli.supervisord_socket): over supervisord's socket, the same calls."""
    if model.service.socket_config is None:
        return ""
    return (
        "; the head asks supervisord the command's calls over the socket its config's"
        " [supervisorctl] section names (the command itself if it names none)"
    )


async def service_helper(context: RunContext, action: ServiceAction, *extra: str) -> StepResult:
    """`node service MODEL ACTION` on the head; the step's result from its reply."""
    model = context.model
    replies = await ask(context, [model.head], ServiceReply, model.name, action, *extra)
    unanswered = not_answered(replies, f"`service {action}`", HEAD_UNREACHABLE)
    if unanswered is not None:
        return unanswered
    reply = one_reply(replies)
    service = reply.answer
    if action != "stop":
        context.start_marks = StartMarks(service.log_sizes, service.failed_starts)
    said = (service.stderr or service.stdout).strip()[-500:]
    # the manager command's own status; the helper's when the command did not run
    exit_status = reply.exit_status if service.exit_status is None else service.exit_status
    label = model.service.label
    if not reply.ok:
        why = said or replies.why_not(model.head)
        return StepResult(
            StepOutcome.FAILED,
            detail=f"{action} {label} failed: {why}",
            output=replies.output(),
            exit_status=exit_status,
        )
    detail = f"{action} {label}: done" + (f" ({said})" if said else "")
    if service.replaced is not None:  # another run stopped it and never started it again
        detail += f"; {left_stopped(service.replaced)}: this run sweeps, starts and clears it"
    return StepResult(
        StepOutcome.OK, detail=detail, output=replies.output(), exit_status=exit_status
    )


@dataclass(frozen=True, kw_only=True)
class StopService(Step):
    """Stop the service on the head, so it cannot respawn ranks while nodes are swept.
    `reason`: the head's stop record says it (default: the recover's)."""

    model: Model
    reason: str | None = None

    def describe(self) -> StepDescription:
        service = self.model.service
        return StepDescription(
            "stop-service",
            self.model.head,
            f"record on {self.model.head} that this run stops {service.label}, then stop the"
            f" {service.manager} service so it cannot respawn ranks during the sweep"
            + asked_over_socket(self.model),
            targets=[service.label],
            argv=service_argv(self.model, "stop"),
        )

    async def run(self, context: RunContext) -> StepResult:
        return await service_helper(
            context,
            "stop",
            "--by",
            context.by,
            "--reason",
            self.reason or f"{self.model.name} is down: stop, sweep, clean, start",
        )


@dataclass(frozen=True, kw_only=True)
class StartService(Step):
    """Let go of the model lock, then start (or restart) the service on the head."""

    model: Model
    action: ServiceAction = "start"

    def describe(self) -> StepDescription:
        service = self.model.service
        who = (
            "the serve wrapper takes the model lock and chooses the backend"
            if service.kind == "wrapper"
            else "the site's start script starts the ranks"
        )
        verb = "restart (the job stays loaded)" if self.action == "restart" else "start"
        return StepDescription(
            f"{self.action}-service",
            self.model.head,
            f"release the model lock, {verb} {service.manager} service {service.label}: {who}"
            + asked_over_socket(self.model),
            targets=[service.label],
            argv=service_argv(self.model, self.action),
        )

    async def run(self, context: RunContext) -> StepResult:
        await context.release_lock()
        return await service_helper(context, self.action)
