"""The collector framework, after node_exporter: one collector per module,
registered by name, each timed and judged on its own so one failure never
fails the scrape."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.samples import Sample

from mlx_medic.inventory import Inventory

log = logging.getLogger("mlx_medic.exporter")

MetricFamily = GaugeMetricFamily  # any *MetricFamily; the alias documents intent


@dataclass
class ExporterContext:
    """What every collector may know about the node it runs on."""

    node: str | None  # its inventory name (mlx_medic.node_identity); None: discovery mode
    inventory: Inventory | None = None
    state_dir: Path = Path("/var/lib/mlx-medic")
    clock: Callable[[], float] = time.time

    def models_here(self):  # -> list[Model]
        if self.inventory is None or self.node is None:
            return []
        return self.inventory.models_on(self.node)


class Collector:
    """Base class. Subclasses set `name`, take their data source in `__init__`
    (injectable for tests) and yield fresh metric families from `collect`."""

    name: ClassVar[str] = ""

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop background work, if any."""


CollectorFactory = Callable[[ExporterContext], Collector]


@dataclass(frozen=True)
class Registration:
    name: str
    default_enabled: bool
    factory: CollectorFactory
    help: str


REGISTRY: dict[str, Registration] = {}


def register(name: str, *, default_enabled: bool = True, help: str = ""):
    """Class or factory decorator: makes `--collector.NAME` exist."""

    def wrap(factory: CollectorFactory) -> CollectorFactory:
        if name in REGISTRY:
            raise ValueError(f"collector {name!r} registered twice")
        REGISTRY[name] = Registration(name, default_enabled, factory, help)
        return factory

    return wrap


class ScrapeCollector(PromCollector):
    """Runs the enabled collectors and adds per-collector duration and success."""

    def __init__(self, collectors: list[Collector]):
        self.collectors = collectors

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collect() is not free: skip client_python's auto-describe

    def collect(self) -> Iterator[Metric]:
        duration = GaugeMetricFamily(
            "mlx_medic_collector_duration_seconds",
            "How long each collector took on this scrape.",
            labels=["collector"],
        )
        success = GaugeMetricFamily(
            "mlx_medic_collector_success",
            "1 if the collector succeeded on this scrape, else 0 (see the exporter's log).",
            labels=["collector"],
        )
        for collector in self.collectors:
            start = time.perf_counter()
            try:
                families = list(collector.collect())
            except Exception:
                log.exception("collector %s failed", collector.name)
                families, ok = [], 0.0
            else:
                ok = 1.0
            yield from families
            duration.add_metric([collector.name], time.perf_counter() - start)
            success.add_metric([collector.name], ok)
        yield duration
        yield success

    def close(self) -> None:
        for collector in self.collectors:
            collector.close()


def sample_value(families: Iterable[object], name: str, labels: dict[str, str]) -> float | None:
    """The value of one sample among collected families (a test helper that reads well)."""
    for family in families:
        for sample in getattr(family, "samples", []):
            if isinstance(sample, Sample) and sample.name == name and sample.labels == labels:
                return sample.value
    return None
