"""Start-up: what a remediator process that died left in flight.

Its runs are journaled interrupted; the model lock each held is released where its
holder is really gone (a node that does not answer leaves it to the next run, which
breaks a lock whose holder is gone or whose lease ran out); and a service one of them
stopped and never started again gets a `finish-stop` run, which sweeps before it
starts, unless someone else stopped it or the model is paused or its circuit open:
then a person is told and it stays stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockMisconfigured, ModelLocks
from mlx_medic.node.client import HelperCallError, HelperMisconfigured, NodeHelpers
from mlx_medic.remediator.active_run import ActiveRun
from mlx_medic.remediator.config import ConfigSource, command_line
from mlx_medic.remediator.engine_metrics import EngineMetrics
from mlx_medic.remediator.journal import Journal, RunView
from mlx_medic.remediator.playbooks import FINISH_STOP, Playbook
from mlx_medic.remediator.playbooks.finish_stop import read_stop_record
from mlx_medic.remediator.steps import is_run_by, run_by
from mlx_medic.transport import TransportError

log = logging.getLogger("mlx_medic.remediator.engine")  # the engine's parts log as one


@dataclass
class StartupRecovery:
    """Runs once, before the first alert is decided."""

    inventory: Inventory
    journal: Journal
    locks: ModelLocks
    helpers: NodeHelpers
    playbooks: Mapping[str, Playbook]
    metrics: EngineMetrics
    clock: Callable[[], float]
    hostname: str
    owner: str  # this process's owner tag, for the runs it creates
    queue: Callable[[ActiveRun], None]  # give the engine a run to start
    config_source: ConfigSource | None = None  # the service's config: its commands name it

    async def recover(self) -> None:
        """Mark what a dead process left in flight, release the locks those runs held,
        and finish the stops they left."""
        now = self.clock()
        ended: list[RunView] = []
        for run_id in self.journal.mark_interrupted(now, hostname=self.hostname):
            run = self.journal.get_run(run_id)
            self.journal.add_event(
                "interrupted",
                now=now,
                model=run.model if run else None,
                run_id=run_id,
                detail="found in flight at start-up; its process is gone",
            )
            log.warning("run %s was interrupted by a crash", run_id)
            if run is not None and run.model in {m.name for m in self.inventory.models}:
                ended.append(run)
        await asyncio.gather(*(self._release_lock(run) for run in ended))
        await self._finish_left_stopped(ended)

    async def _release_lock(self, run: RunView) -> None:
        """The lock an interrupted run held, released if its holder is gone."""
        model = self.inventory.model(run.model)
        host, _, pid = run.owner.rpartition(":")
        try:
            info = await asyncio.wait_for(
                self.locks.release_of_ended_run(model.name, str(run.id), host, int(pid)),
                self.inventory.ssh.connect_timeout + 10,
            )
        except (TransportError, TimeoutError) as exc:
            detail = (
                f"could not check the lock of interrupted run {run.id} on"
                f" {model.head} at start-up: {exc or 'no answer'}; a lock it left"
                " there is broken by the next run that finds its holder gone or"
                " its lease run out"
            )
            log.warning(
                "start-up lock check failed: %s",
                detail,
                extra={"model": model.name, "node": model.head},
            )
            if isinstance(exc, LockMisconfigured):
                self.metrics.node_misconfigured(model.name, exc.misconfiguration)
            else:
                self.metrics.node_unreachable(model.name, model.head)
            self._event("lock_check_failed", model, detail)
            return
        if info is not None:
            detail = f"released a stale lock of dead pid {info.pid} (run {info.run_id})"
            self._event("lock_released", model, detail)

    async def _finish_left_stopped(self, interrupted: list[RunView]) -> None:
        """A service an interrupted run stopped and never started again (this process died
        between its stop and its start): queue `finish-stop` for it, which sweeps before it
        starts. A stop by anyone else (a person, another run), or on a paused model or one
        whose circuit is open, is journaled and left to a person."""
        playbook = self.playbooks.get(FINISH_STOP)
        if playbook is None:
            return
        ours = {run.model: run for run in interrupted}
        await asyncio.gather(
            *(
                self._check_stop(self.inventory.model(name), run, playbook)
                for name, run in ours.items()
            )
        )

    async def _check_stop(self, model: Model, interrupted: RunView, playbook: Playbook) -> None:
        """One model's stop record: finish what `interrupted` (our run) left, or tell."""
        try:
            record = await read_stop_record(self.helpers, model)
        except HelperCallError as exc:
            if isinstance(exc, HelperMisconfigured):
                self.metrics.node_misconfigured(model.name, exc.misconfiguration)
            elif exc.unreachable:
                self.metrics.node_unreachable(model.name, model.head)
            self._event(
                "service_check_failed",
                model,
                f"could not read whether a run left {model.service.label} stopped"
                f" on {model.head} at start-up: {exc}",
            )
            return
        if record is None:
            return
        said = f"{model.service.label} on {model.head} was left stopped by {record.run}"
        control = self.journal.blocking_control(model.name)
        host, _, pid_text = interrupted.owner.rpartition(":")  # its owner tag, host:pid
        pid = int(pid_text) if pid_text.isdigit() else None
        ours = run_by(interrupted.id, host, pid)
        if not is_run_by(record.run, interrupted.id, host, pid) or control is not None:
            why = (
                f"not by {ours}, which was interrupted"
                if control is None
                else "the model is paused"
                if control.kind == "pause"
                else "the model's circuit is open"
            )
            self._event(
                "service_left_stopped",
                model,
                f"{said} ({record.reason}); {why}: left stopped for a person to"
                f" start (`{command_line(self.config_source, 'remediate', model.name)}` sweeps"
                " first)",
            )
            log.warning("%s; left stopped (%s)", said, why, extra={"model": model.name})
            return
        run_id = self.journal.create_run(
            model=model.name,
            playbook=FINISH_STOP,
            trigger_kind="startup",
            owner=self.owner,
            now=self.clock(),
        )
        self._event(
            "service_left_stopped",
            model,
            f"{said} ({record.reason}); run {run_id} sweeps every node, then starts it",
            run_id=run_id,
        )
        log.warning("%s; run %s finishes its work", said, run_id, extra={"model": model.name})
        # start-up: no other run of the model yet
        self.queue(ActiveRun(run_id, model.name, playbook, False, "startup"))

    def _event(self, kind: str, model: Model, detail: str, *, run_id: int | None = None) -> None:
        """A journal event about one model, written now."""
        self.journal.add_event(
            kind, now=self.clock(), model=model.name, run_id=run_id, detail=detail
        )
