"""`finish-stop`: a service a remediation run stopped and never started again.

Why: the remediator may die (or a replica give up) between its stop and its start; the
head then keeps the record "stopped by remediator run N" (`mlx-medic node service MODEL
stop` writes it before it stops). At start-up the remediator finishes that run's work:
sweep every node first (the dead run may have left ranks half-swept), clean, start,
verify. Processes that survive SIGKILL (uninterruptible: only a reboot of their node ends
them) never keep the service stopped: the sweep names them with their node's reboot
advice, the service is started, and the run ends naming them (verified: succeeded; a
survivor holding the model's port: the verify fails and the run escalates with "reboot
NODE ..." as the next action). A survivor the sweep could have ended, or a node that does
not answer, escalates with nothing started. Undoing the stop without a sweep would start
on top of possible orphans, so it never does.
"""

from __future__ import annotations

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperCallError, NodeHelpers
from mlx_medic.node.replies import ServiceReply
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict
from mlx_medic.remediator.steps import (
    REMEDIATOR_RUN,
    CleanTmp,
    Escalate,
    RunContext,
    StartService,
    Step,
    Sweep,
    Verify,
)
from mlx_medic.state.service_stop import ServiceStop

FINISH_STOP = "finish-stop"


async def read_stop_record(helpers: NodeHelpers, model: Model) -> ServiceStop | None:
    """The head's "stopped by" record, from `node service MODEL status` (`stopped_by`:
    {run, at, reason} or null); HelperCallError when the head cannot be asked or says no."""
    reply = await helpers.call(model.head, ServiceReply, model.name, "status")
    if not reply.ok:
        raise HelperCallError(
            model.head, "service", f"exit {reply.exit_status}: {reply.stderr.strip()[-300:]}"
        )
    return reply.answer.stopped_by


class FinishStopPlaybook(Playbook):
    """Sweep every node (a node that does not answer, or a survivor the sweep could have
    ended, escalates: nothing is started; unkillable survivors are named and the start
    goes on), clean, start, verify; escalate after a failed verify, with the survivors'
    reboot advice when the sweep left any."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        steps: list[Step] = [Sweep(model=model)]
        if model.scope_dirs():
            steps.append(CleanTmp(model=model))
        return [
            *steps,
            StartService(model=model),
            Verify(model=model),
            Escalate(model=model, fallback=True),
        ]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        """Act only while the head still says a remediation run stopped the service."""
        model = context.model
        probed = f"`mlx-medic node service {model.name} status` on the head {model.head}, over SSH"
        try:
            record = await read_stop_record(context.node_helpers, model)
        except HelperCallError as exc:
            return RecheckVerdict.not_asked(
                f"could not read {model.head}'s service record: {exc}",
                model.head,
                exc,
                probed=probed,
            )
        if record is None or not record.run.startswith(REMEDIATOR_RUN):
            return RecheckVerdict.skip(
                f"{model.service.label} is no longer left stopped by a run", probed=probed
            )
        return RecheckVerdict.act(
            f"{model.service.label} was left stopped by {record.run} ({record.reason});"
            " finishing its work: sweep, clean, start",
            probed=probed,
        )
