"""The start phase: refuse when the model is already being started or served, take the
model lock, and prepare every node: start sweep, then at once the clean, the new run
recorded as current with its lease, and each node's ledger. Nothing starts on top of
possible orphans: an unreachable node or a process that survives the sweep and is not in
uninterruptible sleep stops the start, named. What is unkillable is recorded in its
node's ledger and the start goes on around it (mlx_medic.processes.survivors), unless it holds the
model's port; a listener that answers means another instance serves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockHandle, LockRefused, ModelLocks
from mlx_medic.processes.survivors import SurvivorVerdict
from mlx_medic.serve.nodes import ModelNodes, StartRefused
from mlx_medic.serve.record import ServeRecord, wrapper_alive
from mlx_medic.service_manager import service_argv

log = logging.getLogger("mlx_medic.serve")


class AlreadyServed(Exception):
    """Another wrapper starts or serves the model: exit at once, touching nothing."""


def busy_message(model: Model, why: str) -> str:
    restart = shlex.join(service_argv(model, "restart"))
    return (
        f"model {model.name} is already being started or served: {why}. A second"
        f" `mlx-medic serve` changes nothing; to restart the model, restart its service"
        f" (`{restart}`): that stops the running wrapper, which ends every rank of its"
        " run, and starts a new one"
    )


def refuse_if_live(model: Model, record: ServeRecord | None) -> None:
    if record is not None and wrapper_alive(record):
        raise AlreadyServed(
            busy_message(
                model, f"wrapper pid {record.pid} ({record.state}, run {record.run_id}) lives"
            )
        )


async def take_lock(locks: ModelLocks, model: Model, run_id: str) -> LockHandle:
    """The model lock, without waiting: a held lock means another start or a remediation."""
    match await locks.acquire(model.name, "serve", run_id, wait=0.0):
        case LockRefused(kind="locked", why=why):
            raise AlreadyServed(busy_message(model, why))
        case LockRefused(why=why):  # unreachable, or its helper failed: we cannot tell
            raise StartRefused(f"cannot take the model lock: {why}")
        case LockHandle() as handle:
            return handle


@dataclass
class StartPrepared:
    """What the start sweep left: its survivors, each node's ledger as the sweep left it,
    and the clean, still running (stale files waste space, they start no rank)."""

    survivors: SurvivorVerdict
    ledgers: dict[str, dict[str, Any]]
    cleaning: asyncio.Task[list[str]]


async def refuse_if_answering(model: Model) -> None:
    """A model that answers on its port is served by another instance: the start touches
    nothing on any node (the seed's rule: an active server must not be disrupted)."""
    from mlx_medic.health import probe_host, probe_model_async

    result = await probe_model_async(probe_host(model.host), model.port, timeout=5.0)
    if result.up:
        raise AlreadyServed(
            f"another instance serves model {model.name} on port {model.port}:"
            f" {result.reason}; a serving process is never touched, so this"
            " start touches nothing on any node: stop it, or leave the model"
            " to it"
        )


async def prepare_nodes(
    nodes: ModelNodes,
    run_id: str,
    lease: float,
    holder: str,
    recorded: Callable[[], None],
    crashed_run: str | None = None,
) -> StartPrepared:
    """On every node at once: the start sweep and the new run recorded as current (the
    crashed run's guards then end what the sweep has not yet); then the clean, left
    running beside the launch. `recorded` is called before the run is recorded anywhere
    (from then on the teardown must end it). On a relaunch after `crashed_run` (the
    wrapper's own) its listener goes too; on a first start an answering model means
    another instance serves, and nothing is touched."""
    if crashed_run is None:
        with phase("probe of the model's port"):
            await refuse_if_answering(nodes.model)
    recorded()
    with phase("start sweep and run record"):
        sweep, problems = await asyncio.gather(
            nodes.start_sweep(crashed_run), nodes.record_run(run_id, lease, holder)
        )
    for node, swept in sweep.replies.items():
        for line in sweep.said.get(node, "").splitlines():
            log.warning("start sweep on %s: %s", node, line)
        if swept.signalled:
            log.warning(
                "start sweep on %s ended %d process(es) of the model (no run of it may"
                " exist before this start)",
                node,
                len(swept.signalled),
            )
    if sweep.serving:
        node, listener = next(iter(sweep.serving.items()))
        raise AlreadyServed(
            f"another instance serves model {nodes.model.name} on port"
            f" {nodes.model.port}: pid {listener.pid} on {node} answers"
            " the health probe, and a serving process is never touched; stop"
            " it, or leave the model to it"
        )
    assert sweep.survivors is not None
    if sweep.blocked:
        raise BlockedBySurvivor(sweep.survivors, nodes.helpers.inventory)
    if not sweep.complete:
        raise StartRefused(
            "the start sweep is incomplete, so nothing is started on top of"
            " possible orphans: " + "; ".join(sweep.problems)
        )
    if problems:
        raise StartRefused(
            "the new run could not be recorded on every node: " + "; ".join(problems)
        )
    if sweep.survivors.survivors:
        log.warning(
            "start sweep: what survives SIGKILL is recorded in each node's ledger and"
            " the start goes on around it: %s",
            sweep.survivors.describe(nodes.helpers.inventory),
        )
    return StartPrepared(sweep.survivors, sweep.ledgers, asyncio.create_task(cleaned(nodes)))


async def cleaned(nodes: ModelNodes) -> list[str]:
    """The clean on every node, its problems logged (the start goes on)."""
    problems = await nodes.clean()
    for problem in problems:
        log.warning("clean failed (the start goes on): %s", problem)
    return problems


class BlockedBySurvivor(StartRefused):
    """A process no sweep can end holds what no start can do without: reboot its node."""

    def __init__(self, verdict: SurvivorVerdict, inventory: Inventory | None = None):
        super().__init__(verdict.refusal(inventory))
        self.verdict = verdict


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Log how long one phase of a start took (where a crash's recovery time goes)."""
    started = time.monotonic()
    try:
        yield
    finally:
        log.info("phase %s: %.2fs", name, time.monotonic() - started)
