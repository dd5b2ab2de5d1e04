"""The service's side of the journal's bound: a prune at start and every
`journal_retention.interval` (remediator/journal/retention.py says what goes), in a
worker thread so the event loop keeps answering webhooks, `/healthz` and `/metrics`
meanwhile; and its series: the journal's size, the rows pruned, the prunes that failed.

A prune that fails is logged and counted, and the next one tries again: a bound that
cannot be kept now is no reason to stop remediating.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from mlx_medic.remediator.config import JournalRetention
from mlx_medic.remediator.journal.retention import PruneResult, journal_bytes, prune

log = logging.getLogger("mlx_medic.remediator.journal_pruning")


class JournalSize:
    """`mlx_medic_journal_size_bytes`, read from the file system at every scrape: the
    on-call commands write the same file from other processes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> list[Metric]:
        size = GaugeMetricFamily(
            "mlx_medic_journal_size_bytes",
            "Bytes the remediator's journal takes on disk: the SQLite file and its WAL.",
        )
        size.add_metric([], journal_bytes(self.path))
        return [size]


class PruneMetrics:
    """The journal's size and what the prunes did, on the service's registry."""

    def __init__(self, registry: CollectorRegistry, path: Path) -> None:
        registry.register(JournalSize(path))  # type: ignore[arg-type]
        self.pruned = Counter(
            "mlx_medic_journal_pruned_rows_total",
            "Rows the journal's retention deleted, by table (runs, steps, firings, events).",
            ["table"],
            registry=registry,
        )
        self.failures = Counter(
            "mlx_medic_journal_prune_failures_total",
            "Prunes of the journal that failed (logged; the next one tries again).",
            registry=registry,
        )
        for table in ("runs", "steps", "firings", "events"):
            self.pruned.labels(table=table)

    def record(self, result: PruneResult) -> None:
        for table, count in result.rows().items():
            self.pruned.labels(table=table).inc(count)


async def prune_periodically(
    path: Path,
    retention: JournalRetention,
    budget_windows: Iterable[float],
    metrics: PruneMetrics,
    interval: float | None = None,
) -> None:
    """Prune now and then every `interval` (default: the config's) until cancelled."""
    bounds = retention.bounds(budget_windows)
    while True:
        try:
            result = await asyncio.to_thread(prune, path, bounds)
        except Exception as exc:  # sqlite3/OS errors: counted, the service goes on
            metrics.failures.inc()
            log.error("journal prune failed: %s", exc, extra={"journal": str(path)})
        else:
            metrics.record(result)
            log.info("journal pruned: %s", result.summary(), extra={"journal": str(path)})
        await asyncio.sleep(retention.interval if interval is None else interval)
