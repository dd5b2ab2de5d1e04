"""The collector framework: every series says which node it is from (the inventory's name,
added once by the framework), and a collector's failure is its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ScrapeCollector, sample_value


class Fixed(Collector):
    name = "fixed"

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("mlx_fixed", "A gauge.", labels=["model"])
        gauge.add_metric(["m1"], 1.0)
        yield gauge
        yield GaugeMetricFamily("mlx_plain", "A gauge without labels.", value=2.0)
        counter = CounterMetricFamily("mlx_counted", "A counter.", labels=["file"])
        counter.add_metric(["/var/log/x"], 3.0)
        yield counter


class SetsNode(Collector):
    name = "sets_node"

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("mlx_own_node", "Claims a node.", labels=["node"])
        gauge.add_metric(["elsewhere"], 1.0)
        yield gauge


def samples(scrape: ScrapeCollector) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in scrape.collect() for s in family.samples]


def test_with_a_node_name_every_series_carries_it_the_framework_ones_too() -> None:
    scraped = samples(ScrapeCollector([Fixed()], node="ai002"))
    assert {name for name, _ in scraped} == {
        "mlx_fixed",
        "mlx_plain",
        "mlx_counted_total",
        "mlx_medic_collector_duration_seconds",
        "mlx_medic_collector_success",
    }
    assert all(labels.get("node") == "ai002" for _, labels in scraped), scraped
    assert ("mlx_fixed", {"node": "ai002", "model": "m1"}) in scraped
    assert ("mlx_plain", {"node": "ai002"}) in scraped


def test_without_a_node_name_no_series_has_a_node_label() -> None:
    scraped = samples(ScrapeCollector([Fixed()]))
    assert scraped and not [labels for _, labels in scraped if "node" in labels]


def test_a_collector_that_sets_node_itself_fails_alone() -> None:
    families = list(ScrapeCollector([SetsNode(), Fixed()], node="ai002").collect())
    ok = {"node": "ai002", "collector": "fixed"}
    bad = {"node": "ai002", "collector": "sets_node"}
    assert sample_value(families, "mlx_medic_collector_success", bad) == 0.0
    assert sample_value(families, "mlx_medic_collector_success", ok) == 1.0
    assert sample_value(families, "mlx_own_node", {"node": "elsewhere"}) is None


def test_scrapes_of_one_exporter_never_overlap() -> None:
    inside, overlapped = threading.Semaphore(1), []

    class Slow(Collector):
        name = "slow"

        def collect(self) -> Iterator[Metric]:
            if not inside.acquire(blocking=False):
                overlapped.append(True)
            time.sleep(0.05)
            inside.release()
            return iter(())

    scrape = ScrapeCollector([Slow()])
    threads = [threading.Thread(target=lambda: list(scrape.collect())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert overlapped == []
