"""The collector framework, after node_exporter: one collector per module,
registered by name (with its settings as `--collector.NAME.SETTING` flags), each
timed and judged on its own so one failure never fails the scrape."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.samples import Sample

from mlx_medic.exporter.settings import read_settings
from mlx_medic.state.layout import (
    DEFAULT_STATE_DIR,
    Owner,
    StateFileError,
    node_owner,
    prepare_state_dir,
)

if TYPE_CHECKING:  # the inventory's schema (pydantic) loads only when there is an inventory
    from _typeshed import DataclassInstance

    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory

log = logging.getLogger("mlx_medic.exporter")

MetricFamily = GaugeMetricFamily  # any *MetricFamily; the alias documents intent
NODE_LABEL = "node"  # added by the framework to every series; no collector sets it

S = TypeVar("S", bound="DataclassInstance")


@dataclass
class ExporterContext:
    """What every collector may know about the node it runs on.

    `node` is the inventory's name for this node; None without an inventory (discovery
    mode), where nothing is named after a node because identity is never guessed.
    `settings` holds each collector's parsed settings, by settings class.
    `state_owner` owns what the exporter makes in `state_dir`: the node's login user
    (mlx_medic.state.layout) once `prepare_state_dir` ran; None: nobody named (discovery
    mode), what is made belongs to the owner of the dir it is made in.
    """

    node: str | None = None
    inventory: Inventory | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    state_owner: Owner | None = None
    clock: Callable[[], float] = time.time
    settings: Mapping[type, object] = field(default_factory=dict)
    _state_prepared: bool = field(default=False, repr=False, compare=False)

    def prepare_state_dir(self) -> Owner | None:
        """Once per exporter: make `state_dir` for the node's login user (or `state_owner`)
        and correct what root or a wider mode left in it, before a collector writes there,
        so the node helpers can use every dir and lock the exporter made. The owner; None
        in discovery mode or when it cannot be done (logged: probes then stay
        serialized within this process only)."""
        if self._state_prepared:
            return self.state_owner
        self._state_prepared = True
        try:
            owner = self.state_owner
            if owner is None and self.inventory is not None and self.node is not None:
                owner = node_owner(self.inventory.node(self.node).user)
            if owner is None:
                return None  # discovery mode writes nothing there
            prepared = prepare_state_dir(self.state_dir, owner)
        except StateFileError as exc:
            log.error("state dir %s: %s", self.state_dir, exc)
            return None
        self.state_owner = owner
        for line in prepared.corrected:
            log.warning(
                "corrected %s: the state dir belongs to %s (the node's login user)", line, owner
            )
        for line in prepared.left:
            log.warning("state dir: %s", line)
        return owner

    def models_here(self) -> list[Model]:
        if self.inventory is None or self.node is None:
            return []
        return self.inventory.models_on(self.node)

    def settings_for(self, kind: type[S]) -> S:
        """The collector's settings as parsed from its flags, else from variables and defaults."""
        found = self.settings.get(kind)
        return found if isinstance(found, kind) else read_settings(kind)


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
    settings: type[DataclassInstance] | None = None


REGISTRY: dict[str, Registration] = {}


def register(
    name: str,
    *,
    default_enabled: bool = True,
    help: str = "",
    settings: type[DataclassInstance] | None = None,
) -> Callable[[CollectorFactory], CollectorFactory]:
    """Factory decorator: makes `--collector.NAME` exist, and a flag per field of `settings`."""

    def wrap(factory: CollectorFactory) -> CollectorFactory:
        if name in REGISTRY:
            raise ValueError(f"collector {name!r} registered twice")
        REGISTRY[name] = Registration(name, default_enabled, factory, help, settings)
        return factory

    return wrap


def _with_node(family: Metric, node: str) -> Metric:
    for sample in family.samples:
        if NODE_LABEL in sample.labels:
            raise ValueError(f"{family.name} sets the {NODE_LABEL!r} label the framework adds")
    family.samples = [s._replace(labels={NODE_LABEL: node, **s.labels}) for s in family.samples]
    return family


class ScrapeCollector(PromCollector):
    """Runs the enabled collectors and adds per-collector duration and success.

    With a `node`, every series it serves carries `node="<name>"`, its own included.
    Scrapes run one at a time: collectors keep state between scrapes.
    """

    def __init__(self, collectors: list[Collector], node: str | None = None):
        self.collectors = collectors
        self.node = node
        self._lock = threading.Lock()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collect() is not free: skip client_python's auto-describe

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            return iter(self._scrape())

    def _scrape(self) -> list[Metric]:
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
        scraped: list[Metric] = []
        for collector in self.collectors:
            start = time.perf_counter()
            try:
                families = list(collector.collect())
                if self.node is not None:
                    families = [_with_node(family, self.node) for family in families]
            except Exception:
                log.exception("collector %s failed", collector.name)
                families, ok = [], 0.0
            else:
                ok = 1.0
            scraped += families
            duration.add_metric([collector.name], time.perf_counter() - start)
            success.add_metric([collector.name], ok)
        own: list[Metric] = [duration, success]
        if self.node is not None:
            own = [_with_node(family, self.node) for family in own]
        return scraped + own

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
