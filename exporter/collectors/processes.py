"""`processes`: MLX processes on this node by model, role and state, the
orphans among them with the rule that found each, and the suspects apart.

Orphans are judged by rules a node can apply alone (mlx_medic.processes.orphans), never
by `ppid == 1`: on a peer an orphaned rank keeps its stuck sshd as parent.
Suspects (ranks of which at most some can be current, with nothing to tell
which) are a series of their own, so nothing that counts or sweeps orphans
counts them. The judging is the shared scan's (`mlx_medic.processes.orphan_scan`, which the
node helpers `orphans` and `sweep --orphans-only` use too); this collector keeps one
scan between scrapes, for its caches, and turns its report into series.

Small scrapes (docs/metrics.md): only what the alerts read is always present, 0 when
empty: `mlx_orphan_processes` by model and state (every state of the closed set, for every
inventory model) and `mlx_orphan_oldest_age_seconds` by model. The breakdowns (processes by
role and state, orphans and suspects by role, state and rule, remote suspects by peer) have
a series only while it is non-zero: for dashboards and for finding out which rule, never
for an alert that needs 0. An orphan that the node's protection-domain ledger records as a
survivor of SIGKILL (same pid and start time) is not counted as an orphan: no sweep can end
it, so it is served as `mlx_unkillable_processes` by the `ledger` collector instead, and the
orphan alert does not send the remediator to sweep it again and again.

    mlx_processes{model="glm-4_6-5b",role="rank",state="uninterruptible"} 3.0
    mlx_orphan_processes{model="glm-4_6-5b",state="sleeping"} 2.0
    mlx_orphan_processes_by_rule{model="glm",role="rank",rule="excess_ranks",state="sleeping"} 2.0
    mlx_suspected_orphan_processes{model="qwq",role="rank",rule="duplicate_rank_undecided",...} 2.0
    mlx_orphan_oldest_age_seconds{model="glm-4_6-5b"} 61200.0
    mlx_suspected_remote_orphans{model="glm-4_6-5b",peer="ai002"} 1.0
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import GaugeMetricFamily

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.platform.listening import Probe, listening_probe
from mlx_medic.platform.process_table import system_process_table
from mlx_medic.processes.info import ProcessTable, State
from mlx_medic.processes.orphan_scan import OrphanScan, ProcessReader, read_as_process
from mlx_medic.processes.orphans import (
    Established,
    Orphan,
    OrphanReport,
    Scoped,
    Suspect,
    psutil_established,
)
from mlx_medic.processes.roles import PatternSet, classifier
from mlx_medic.state.ledger import START_TOLERANCE, LedgerError, read_ledger

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

log = logging.getLogger("mlx_medic.exporter.processes")

STATES = tuple(State)


class ProcessesCollector(Collector):
    name = "processes"

    def __init__(
        self,
        *,
        node: str | None,
        inventory: Inventory | None,
        state_dir: Path,
        table: ProcessTable,
        clock: Callable[[], float],
        established: Established = psutil_established,
        listening: Callable[[], Probe] = listening_probe,  # a fresh probe per scrape
        read_file: ProcessReader = read_as_process,
        boot_id: Callable[[], str] = current_boot_id,
    ):
        self.node = node
        self.inventory = inventory
        self.state_dir = state_dir
        self.table = table
        self.clock = clock
        self.boot_id = boot_id
        self._ledger_problem: str | None = None  # logged once until it changes
        # The shared scan (also the node helpers'), kept between scrapes for its caches.
        self.orphan_scan = OrphanScan(
            node=node,
            inventory=inventory,
            state_dir=state_dir,
            established=established,
            listening=listening,
            read_file=read_file,
        )
        self._announced: set[str] = set(self._known_models())

    def _known_models(self) -> list[str]:
        return [m.name for m in self.inventory.models] if self.inventory else []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        snapshot = self.table.snapshot()
        now = self.clock()
        result = self.orphan_scan.scan(snapshot)
        scoped, report = result.scoped, result.report
        models = list(dict.fromkeys([*self._known_models(), *(s.model for s in scoped)]))
        self._announce(scoped)
        yield self._processes(Counter((s.model, s.role, s.proc.state) for s in scoped))
        yield from self._orphans(models, report, now, self._survivors())

    def _survivors(self) -> list[tuple[int, float]]:
        """(pid, start time) of every survivor of SIGKILL this node's ledger records; none
        without a node name, or when the ledger cannot be read (the ledger collector then
        fails and says why; the orphans are counted as before)."""
        if self.node is None:
            return []
        try:
            ledger = read_ledger(self.state_dir, self.node, self.boot_id())
        except (LedgerError, OSError) as exc:
            if str(exc) != self._ledger_problem:
                self._ledger_problem = str(exc)
                log.warning("orphans recorded as unkillable are counted as orphans: %s", exc)
            return []
        self._ledger_problem = None
        return [(entry.pid, entry.start_time) for entry in ledger.survivors]

    def _announce(self, scoped: list[Scoped]) -> None:
        """One log line per model found without an inventory, saying how it was found."""
        for item in scoped:
            if item.model not in self._announced:
                self._announced.add(item.model)
                log.info(
                    "watching model %s: found by the --model argument of %s pid %d",
                    item.model,
                    item.role,
                    item.proc.pid,
                )

    @staticmethod
    def _processes(counts: Counter) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "mlx_processes",
            "MLX processes on this node by model, role (launcher, ssh_client, rank, share,"
            " exo_runner) and state; a series only while non-zero. uninterruptible is Linux"
            " D or macOS U: such a process ignores SIGKILL.",
            labels=["model", "role", "state"],
        )
        return _nonzero(family, counts)

    def _orphans(
        self,
        models: list[str],
        report: OrphanReport,
        now: float,
        survivors: Sequence[tuple[int, float]] = (),
    ) -> Iterable[GaugeMetricFamily]:
        sweepable = [
            o for o in report.orphans if not any(_same(o, pid, start) for pid, start in survivors)
        ]
        by_state = GaugeMetricFamily(
            "mlx_orphan_processes",
            "MLX processes on this node left over from a dead or replaced run, by model and"
            " state, every state present (0 when none): what the orphan alerts read. Which"
            " rule found them and their roles: mlx_orphan_processes_by_rule. Never judged by"
            " ppid == 1, never a rank that serves the model's port; where the evidence cannot"
            " tell, see mlx_suspected_orphan_processes. Not counted: an orphan the node's"
            " protection-domain ledger records as a survivor of SIGKILL (same pid and start"
            " time), which no sweep can end: see mlx_unkillable_processes.",
            labels=["model", "state"],
        )
        states = Counter((o.model, o.proc.state) for o in sweepable)
        for model in models:
            for state in STATES:
                by_state.add_metric([model, state], states[(model, state)])
        yield by_state
        yield self._by_rule(
            "mlx_orphan_processes_by_rule",
            "The orphans of mlx_orphan_processes by role, state and the rule that found them"
            " (a series only while non-zero): stale_run_id (run tag is not the model's"
            " current run here), launcher_gone (its mlx.launch, or an exo runner's exo, is"
            " gone), ssh_client_lost (its sshd session has no client), duplicate_rank"
            " (another live rank with the same launch placement and rank number is the"
            " current one: it serves the model's port, or is still held by a launcher or a"
            " connected ssh session), excess_ranks (more ranks than the model runs here; the"
            " current ones told the same way).",
            sweepable,
        )
        yield self._by_rule(
            "mlx_suspected_orphan_processes",
            "MLX processes on this node of which at most some can be current, with nothing"
            " to tell which (shown, never swept; not counted in mlx_orphan_processes), by"
            " role, state and rule, a series only while non-zero: duplicate_rank_undecided"
            " (live ranks with the same launch placement and rank number, each still held by"
            " a launcher or a connected ssh session, none serving the model's port),"
            " excess_ranks_undecided (more ranks than the model runs here, told apart by"
            " none of that).",
            report.suspects,
        )

        oldest = GaugeMetricFamily(
            "mlx_orphan_oldest_age_seconds",
            "Age of the oldest orphan of the model on this node (0 when there is none).",
            labels=["model"],
        )
        for model in models:
            created = [o.proc.create_time for o in report.orphans if o.model == model]
            oldest.add_metric([model], max(0.0, now - min(created)) if created else 0.0)
        yield oldest

        suspected = GaugeMetricFamily(
            "mlx_suspected_remote_orphans",
            "ssh clients of a dead mlx.launch on this node, by the peer they point at: that"
            " peer probably holds orphaned ranks of the model. A series only while non-zero.",
            labels=["model", "peer"],
        )
        yield _nonzero(suspected, Counter(report.suspected_remote))

    @staticmethod
    def _by_rule(name: str, help_text: str, found: Iterable[Orphan | Suspect]) -> GaugeMetricFamily:
        """The found processes by model, role, state and rule; no series for a zero."""
        family = GaugeMetricFamily(name, help_text, labels=["model", "role", "state", "rule"])
        counts = Counter((f.model, f.role, f.proc.state, str(f.rule)) for f in found)
        return _nonzero(family, counts)


def _nonzero(family: GaugeMetricFamily, counts: Counter) -> GaugeMetricFamily:
    """One series per counted label combination, in a stable order: a breakdown for
    dashboards costs a scrape nothing while it is all zero."""
    for labels, value in sorted(counts.items()):
        if value:
            family.add_metric(list(labels), value)
    return family


def _same(orphan: Orphan, pid: int, start_time: float) -> bool:
    return orphan.proc.pid == pid and abs(orphan.proc.create_time - start_time) < START_TOLERANCE


@register(
    "processes", help="MLX processes by model, role and state; orphans by rule; suspects apart"
)
def make(context: ExporterContext) -> Collector:
    return ProcessesCollector(
        node=context.node,
        inventory=context.inventory,
        state_dir=context.state_dir,
        table=system_process_table(classifier(PatternSet.of(context.inventory))),
        clock=context.clock,
    )
