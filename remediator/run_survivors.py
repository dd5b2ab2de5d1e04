"""What a run keeps of the processes its sweeps could not end: the survivors met so far
(merged across its steps), and the unkillable ones (uninterruptible sleep: only a
reboot of the node ends them), gauged per node swept and journaled once per process
as an `unkillable` event carrying the node's reboot advice.

None of this escalates: the sweep's step decided what its survivors mean for the run,
and the node's exporter pages for the reboot (MLXUnkillableSurvivors)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable

from prometheus_client import Gauge

from mlx_medic.inventory import Inventory
from mlx_medic.inventory_model import Model
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.steps import RunContext, StepResult
from mlx_medic.survivors import SurvivorVerdict, reboot_advice

log = logging.getLogger("mlx_medic.remediator.engine")  # the engine's parts log as one

UNKILLABLE_DATA = "processes: "  # in an `unkillable` event, before its JSON


def merged_survivors(found: SurvivorVerdict | None, more: SurvivorVerdict) -> SurvivorVerdict:
    """The survivors a run met so far, each once (a later sweep's word on one wins)."""
    if found is None:
        return more
    again = {s.identity for s in more.survivors}
    return SurvivorVerdict(
        more.model, [s for s in found.survivors if s.identity not in again] + more.survivors
    )


def known_unkillable(journal: Journal, model: str) -> frozenset[tuple[str, int, float]]:
    """(node, pid, start time) of every process a run of the model found unkillable
    and named (journal events `unkillable`), so later runs name it once."""
    found: set[tuple[str, int, float]] = set()
    for event in journal.list_events(model=model, kind="unkillable", limit=10_000):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            data = json.loads(event.detail.partition(UNKILLABLE_DATA)[2])
            found |= {(data["node"], int(pid), float(start)) for pid, start in data["processes"]}
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
        new = [p for p in processes if (node_name, *p) not in context.known_unkillable]
        if not new:
            continue
        data = json.dumps({"node": node_name, "processes": new})
        pids = ", ".join(str(pid) for pid, _ in new)
        placed = [m.name for m in inventory.models_on(node_name)]
        advice = reboot_advice(node_name, named, placed)
        journal.add_event(
            "unkillable",
            now=clock(),
            model=model.name,
            run_id=run_id,
            detail=f"{len(new)} process(es) on {node_name} survive SIGKILL (pids"
            f" {pids}); {advice}. {UNKILLABLE_DATA}{data}",
        )
        log.warning(
            "%s process(es) of %s on %s survive SIGKILL (pids %s); %s",
            len(new),
            model.name,
            node_name,
            pids,
            advice,
            extra={"model": model.name, "node": node_name, "run_id": run_id},
        )
