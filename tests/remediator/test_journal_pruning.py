"""The service's prune: at start and then every interval, in a worker thread so the
event loop keeps answering; a failed prune is counted and the service goes on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.remediator import journal_pruning
from mlx_medic.remediator.config import JournalRetention
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.journal.retention import PruneResult, journal_bytes
from mlx_medic.remediator.journal_pruning import PruneMetrics, prune_periodically
from tests.remediator.conftest import (
    TOKEN,
    Service,
    bearer,
    http,
    silent_inventory,
    start_service,
    wait_until,
    write_config,
)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def start_pruning(tmp_path: Path, metrics: PruneMetrics) -> asyncio.Task[None]:
    """The service's prune loop, every 10 ms."""
    path = tmp_path / "journal.sqlite"
    return asyncio.create_task(prune_periodically(path, JournalRetention(), [], metrics, 0.01))


async def turn_until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.001)


def test_the_service_prunes_at_start_and_every_interval_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    release = threading.Event()

    def slow_prune(path: Path, bounds: Any) -> PruneResult:
        threads.append(threading.current_thread().name)
        release.wait(5)  # a long prune: the loop must not wait for it
        return PruneResult(1, 2, 3, 4, 100, 50, dry_run=False)

    monkeypatch.setattr(journal_pruning, "prune", slow_prune)
    registry = CollectorRegistry()
    metrics = PruneMetrics(registry, tmp_path / "journal.sqlite")

    async def go() -> float:
        task, started = start_pruning(tmp_path, metrics), time.monotonic()
        await turn_until(lambda: bool(threads))  # the loop turns while the first prune is held
        answered_within = time.monotonic() - started
        release.set()
        await turn_until(lambda: len(threads) >= 3)
        task.cancel()
        return answered_within

    assert asyncio.run(go()) < 1
    assert threading.main_thread().name not in threads
    assert sample(registry, "mlx_medic_journal_pruned_rows_total", table="events") >= 8


def test_a_prune_that_fails_is_counted_and_the_next_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def failing_prune(path: Path, bounds: Any) -> PruneResult:
        calls.append(1)
        raise OSError("disk full")

    monkeypatch.setattr(journal_pruning, "prune", failing_prune)
    registry = CollectorRegistry()
    metrics = PruneMetrics(registry, tmp_path / "journal.sqlite")

    async def go() -> None:
        task = start_pruning(tmp_path, metrics)
        await turn_until(lambda: len(calls) >= 2)
        task.cancel()

    asyncio.run(go())
    assert sample(registry, "mlx_medic_journal_prune_failures_total") >= 2


def test_the_journal_size_series_is_its_file_and_wal_at_each_scrape(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    registry = CollectorRegistry()
    PruneMetrics(registry, journal.path)
    journal.add_event("started", now=1.0, detail="x" * 10_000)

    size = sample(registry, "mlx_medic_journal_size_bytes")

    assert size == journal_bytes(journal.path) > Path(f"{journal.path}-wal").stat().st_size > 0
    assert sample(registry, "mlx_medic_journal_pruned_rows_total", table="runs") == 0


def test_the_real_service_prunes_its_journal_at_start_and_serves_its_size(
    tmp_path: Path, services: list[Service]
) -> None:
    journal_path = tmp_path / "journal.sqlite"
    journal = Journal(journal_path)
    journal.add_event("absorbed", now=time.time() - 40 * 86400, model="m1")
    journal.add_event("absorbed", now=time.time(), model="m1")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(silent_inventory(tmp_path).model_dump(mode="json")))
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    config = write_config(
        tmp_path / "remediator.yml",
        {
            "inventory": str(inventory),
            "journal": str(journal_path),
            "auth": {"bearer_token_file": str(tmp_path / "token")},
            "journal_retention": {"max_age": "30d"},
        },
    )
    service = start_service(config, journal_path, tmp_path)
    services.append(service)

    pruned = wait_until(
        lambda: [line for line in service.log_lines() if line["msg"].startswith("journal pruned")],
        what="the prune at start",
    )
    assert "deleted 0 runs, 0 steps, 0 firings, 1 events" in pruned[0]["msg"]
    assert len(journal.list_events()) == 1
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert 'mlx_medic_journal_pruned_rows_total{table="events"} 1.0' in metrics
    assert "mlx_medic_journal_size_bytes " in metrics
