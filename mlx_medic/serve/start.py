"""The start phase: refuse when the model is already being started or served, take the
model lock, and prepare every node: start sweep, clean, then the new run recorded as
current with its lease. Nothing starts on top of possible orphans: an unreachable node or an
unkillable survivor stops the start, named."""

from __future__ import annotations

import logging
import shlex

from mlx_medic.inventory import Model
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.serve.nodes import ModelNodes, StartRefused
from mlx_medic.serve.record import ServeRecord, wrapper_alive
from mlx_medic.service_manager import service_argv

log = logging.getLogger("mlx_medic.serve")


class AlreadyServed(Exception):
    """Another wrapper starts or serves the model: exit at once, touching nothing."""


def busy_message(model: Model, why: str) -> str:
    restart = shlex.join(service_argv(model, "restart"))
    return (f"model {model.name} is already being started or served: {why}. A second"
            f" `mlx-medic serve` changes nothing; to restart the model, restart its service"
            f" (`{restart}`): that stops the running wrapper, which ends every rank of its"
            " run, and starts a new one")  # fmt: skip


def refuse_if_live(model: Model, record: ServeRecord | None) -> None:
    if record is not None and wrapper_alive(record):
        raise AlreadyServed(busy_message(
            model, f"wrapper pid {record.pid} ({record.state}, run {record.run_id}) lives"))


async def take_lock(locks: ModelLocks, model: Model, run_id: str) -> LockHandle:
    """The model lock, without waiting: a held lock means another start or a remediation."""
    handle = await locks.acquire(model.name, "serve", run_id, wait=0.0)
    if handle is None:
        why = locks.refusals.get(model.name, "the model lock is held")
        if model.name in locks.unreachable or model.name in locks.helper_failed:
            raise StartRefused(f"cannot take the model lock: {why}")
        raise AlreadyServed(busy_message(model, why))
    return handle


async def sweep_and_clean(nodes: ModelNodes) -> None:
    """Start sweep, then clean, on every node at once; StartRefused naming what stopped it."""
    sweep = await nodes.start_sweep()
    if not sweep.complete:
        raise StartRefused("the start sweep is incomplete, so nothing is started on top of"
                           " possible orphans: " + "; ".join(sweep.problems))  # fmt: skip
    for node, document in sweep.replies.items():
        for line in sweep.said.get(node, "").splitlines():
            log.warning("start sweep on %s: %s", node, line)
        if document.get("signalled"):
            log.warning("start sweep on %s ended %d process(es) of the model (the listener on"
                        " its port too, if any: no run of it may exist before this start)",
                        node, len(document["signalled"]))  # fmt: skip
    for problem in await nodes.clean():
        log.warning("clean failed (the start goes on): %s", problem)


async def record_run(nodes: ModelNodes, run_id: str, lease: float, holder: str) -> None:
    """The new run current, with its lease, on every node; StartRefused naming a node that
    did not record it."""
    problems = await nodes.record_run(run_id, lease, holder)
    if problems:
        raise StartRefused("the new run could not be recorded on every node: "
                           + "; ".join(problems))  # fmt: skip
