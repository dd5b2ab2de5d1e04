"""What a run keeps of the processes its sweeps could not end: the survivors met so far
(merged across its steps), and the unkillable ones (uninterruptible sleep: only a
reboot of the node ends them), gauged per node swept and journaled once per process
as an `unkillable` event carrying the node's reboot advice.

None of this escalates: the sweep's step decided what its survivors mean for the run,
and the node's exporter pages for the reboot (MLXUnkillableSurvivors)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Gauge

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.processes.survivors import SurvivorVerdict, reboot_advice
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.steps import RunContext, StepResult

log = logging.getLogger("mlx_medic.remediator.engine")  # the engine's parts log as one

UNKILLABLE_DATA = "processes: "  # in an `unkillable` event, before its JSON
Identity = tuple[str, int, float]  # (node, pid, start time) of a process


@dataclass(frozen=True)
class UnkillableRecord:
    """One node's processes a run found unkillable, as an `unkillable` event's detail
    carries them: a sentence for people, then `processes: {"node": ..., "processes":
    [[pid, start], ...]}` for the runs after it (the journal has no column for them)."""

    node: str
    processes: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, node: str, processes: Iterable[tuple[int, float]]) -> UnkillableRecord:
        return cls(node, tuple(processes))

    @property
    def identities(self) -> frozenset[Identity]:
        return frozenset((self.node, pid, start) for pid, start in self.processes)

    @property
    def pids(self) -> str:
        return ", ".join(str(pid) for pid, _ in self.processes)

    def to_detail(self, advice: str) -> str:
        """The event's detail: what survives where, the node's reboot advice, the data."""
        data = json.dumps({"node": self.node, "processes": self.processes})
        return (
            f"{len(self.processes)} process(es) on {self.node} survive SIGKILL (pids"
            f" {self.pids}); {advice}. {UNKILLABLE_DATA}{data}"
        )

    @classmethod
    def parse(cls, detail: str) -> UnkillableRecord:
        """The record in an event's detail; ValueError when it carries none."""
        try:
            data = json.loads(detail.partition(UNKILLABLE_DATA)[2])
            processes = [(int(pid), float(start)) for pid, start in data["processes"]]
            return cls.of(str(data["node"]), processes)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"no unkillable processes in {detail!r}: {exc}") from None


def merged_survivors(found: SurvivorVerdict | None, more: SurvivorVerdict) -> SurvivorVerdict:
    """The survivors a run met so far, each once (a later sweep's word on one wins)."""
    if found is None:
        return more
    again = {s.identity for s in more.survivors}
    return SurvivorVerdict(
        more.model, [s for s in found.survivors if s.identity not in again] + more.survivors
    )


def known_unkillable(journal: Journal, model: str) -> frozenset[Identity]:
    """(node, pid, start time) of every process a run of the model found unkillable
    and named (journal events `unkillable`), so later runs name it once."""
    found: set[Identity] = set()
    for event in journal.list_events(model=model, kind="unkillable", limit=10_000):
        try:
            found |= UnkillableRecord.parse(event.detail).identities
        except ValueError:
            continue  # an event written by hand, or cut short: nothing to count
    return frozenset(found)


def record_unkillable(
    *,
    journal: Journal,
    inventory: Inventory,
    gauge: Gauge,
    clock: Callable[[], float],
    run_id: int,
    model: Model,
    result: StepResult,
    context: RunContext,
) -> None:
    """A sweep's unkillable processes: `gauge` per node swept, and a journal event (a
    warning, with the node's reboot advice) for those no earlier run found."""
    assert result.unkillable is not None
    named = result.survivors.survivors if result.survivors is not None else []
    for node_name, processes in result.unkillable.items():
        gauge.labels(model=model.name, node=node_name).set(len(processes))
        new = UnkillableRecord.of(
            node_name, (p for p in processes if (node_name, *p) not in context.known_unkillable)
        )
        if not new.processes:
            continue
        placed = [m.name for m in inventory.models_on(node_name)]
        advice = reboot_advice(node_name, named, placed)
        journal.add_event(
            "unkillable",
            now=clock(),
            model=model.name,
            run_id=run_id,
            detail=new.to_detail(advice),
        )
        log.warning(
            "%s process(es) of %s on %s survive SIGKILL (pids %s); %s",
            len(new.processes),
            model.name,
            node_name,
            new.pids,
            advice,
            extra={"model": model.name, "node": node_name, "run_id": run_id},
        )
