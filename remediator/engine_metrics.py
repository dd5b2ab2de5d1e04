"""The metrics the remediator exports about its own runs and what holds them back (its
side of alerting-rules/metrics.txt). Their names, labels and help texts are a contract the
alerting rules and dashboards read: change them there first."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.remediator.control_state import ControlsJournal, model_holds
from mlx_medic.remediator.drain import open_drains
from mlx_medic.remediator.journal import ControlView, JournalError

log = logging.getLogger("mlx_medic.remediator.metrics")


class EngineMetrics:
    """The engine's counters, gauges and histogram on one registry, each series of a
    known model present (at 0) from the start, so a rule sees 0 rather than nothing."""

    def __init__(
        self, registry: CollectorRegistry, inventory: Inventory, journal: ControlsJournal
    ) -> None:
        self.remediations = Counter(
            "mlx_medic_remediations_total",
            "Remediation runs by final outcome.",
            ["model", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "mlx_medic_remediation_duration_seconds",
            "Wall time of remediation runs, by model.",
            ["model"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=registry,
        )
        self.journal_failing = Gauge(
            "mlx_medic_journal_failing",
            "1 while the journal cannot record (a full or read-only disk): nothing acts until"
            " it can; deliveries get 503 and the page says why.",
            registry=registry,
        )
        self.in_progress = Gauge(
            "mlx_medic_remediation_in_progress",
            "1 while a run acts on the model.",
            ["model"],
            registry=registry,
        )
        self.last_verified_backend = Gauge(
            "mlx_medic_last_verified_backend",
            "1 for the backend the last remediation run verified the model serving on,"
            " 0 for its other backends (all 0 until a run verified one).",
            ["model", "backend"],
            registry=registry,
        )
        self.escalations = Counter(
            "mlx_medic_escalations_total",
            "Escalations to a person that opened the model's circuit, by reason (a playbook"
            " with its own budget, such as sweep-orphans, pages through its own alert).",
            ["model", "reason"],
            registry=registry,
        )
        self.unreachable = Counter(
            "mlx_medic_node_unreachable_total",
            "Times a node the remediator needed for a model did not answer over SSH: taking"
            " or checking the model lock, the re-check on the head, the start-up check of a"
            " crashed run's lock (nothing was done then), or a playbook step's node helper"
            " (the run then escalated).",
            ["model", "node"],
            registry=registry,
        )
        self.misconfigured = Counter(
            "mlx_medic_node_misconfigured_total",
            "Times a node the remediator needed for a model answered, but its mlx-medic could"
            " not serve the call as deployed, by kind: config-unreadable (its inventory),"
            " helper-missing (no mlx-medic at medic_command), refused (its forced command),"
            " version-mismatch (another mlx-medic than the remediator's). Before any step"
            " acted the run ended misconfigured (nothing was done); a step after one that"
            " acted escalated.",
            ["model", "node", "kind"],
            registry=registry,
        )
        self.unkillable = Gauge(
            "mlx_medic_unkillable_processes",
            "Processes of the model that the remediator's last sweep of the node found"
            " unkillable (uninterruptible sleep survives SIGKILL; only a reboot of the node"
            " clears them and the protection domains they hold; the run goes on around"
            " them).",
            ["model", "node"],
            registry=registry,
        )
        controls = ControlMetrics(
            journal, [m.name for m in inventory.models], [n.name for n in inventory.nodes]
        )
        registry.register(controls)  # type: ignore[arg-type]
        for model in inventory.models:
            self.in_progress.labels(model=model.name).set(0)
            self.duration.labels(model=model.name)
            for node_name in model.nodes:
                self.unkillable.labels(model=model.name, node=node_name).set(0)
            for backend, _spec in model.backends.in_order():
                self.last_verified_backend.labels(model=model.name, backend=backend).set(0)

    def node_unreachable(self, model: str, node: str) -> None:
        """A node the model needed did not answer over SSH."""
        self.unreachable.labels(model=model, node=node).inc()

    def node_misconfigured(self, model: str, found: Misconfiguration) -> None:
        """A node the model needed is deployed wrong for a call (its kind)."""
        self.misconfigured.labels(model=model, node=found.node, kind=found.kind).inc()

    def verified(self, model: Model, backend: str | None) -> None:
        """A run verified the model serving on `backend` (None: a verify that names none
        leaves the gauge as it was)."""
        if backend is None:
            return
        for name, _spec in model.backends.in_order():
            self.last_verified_backend.labels(model=model.name, backend=name).set(
                1 if name == backend else 0
            )


class ControlMetrics:
    """Pause and circuit per model, and each node's drain, read from the journal at every
    scrape: `mlx-medic pause`, `resume`, `drain` and `undrain` write it from another
    process, and the service only reads it before each decision, so no value kept in
    memory would follow them. A journal that cannot be read keeps the last values read
    (the problem is logged once), so an alert on them neither resolves nor fires on a read
    error."""

    def __init__(
        self, journal: ControlsJournal, models: Sequence[str], nodes: Sequence[str] = ()
    ) -> None:
        self.journal = journal
        self.models = list(models)
        self.nodes = list(nodes)
        self._last: list[ControlView] = []
        self._last_drains: dict[str, float] = {}
        self._failing = False

    def _controls(self) -> list[ControlView]:
        try:
            self._last = list(self.journal.controls())
            drains = open_drains(self.journal)
            self._last_drains = {node: drain.since for node, drain in drains.items()}
        except (sqlite3.Error, OSError, JournalError) as exc:
            if not self._failing:
                log.warning("/metrics shows the pauses, circuits and drains last read: %s", exc)
            self._failing = True
        else:
            self._failing = False
        return self._last

    def collect(self) -> list[Metric]:
        paused = GaugeMetricFamily(
            "mlx_medic_paused",
            "1 while automatic remediation of the model is paused, by the pause of all"
            " models (`mlx-medic pause`) or by its own (`mlx-medic pause MODEL`).",
            labels=["model"],
        )
        paused_since = GaugeMetricFamily(
            "mlx_medic_paused_since_timestamp_seconds",
            "Unix time the model's pause began (the older of the pause of all models and"
            " its own), 0 while it is not paused.",
            labels=["model"],
        )
        circuit = GaugeMetricFamily(
            "mlx_medic_circuit_open",
            "1 while the model's circuit is open: the remediator escalated and acts on the"
            " model again only after `mlx-medic resume MODEL`.",
            labels=["model"],
        )
        circuit_since = GaugeMetricFamily(
            "mlx_medic_circuit_open_since_timestamp_seconds",
            "Unix time the model's circuit opened, 0 while it is closed.",
            labels=["model"],
        )
        for model, held in model_holds(self._controls(), self.models).items():
            paused.add_metric([model], 0 if held.paused_since is None else 1)
            paused_since.add_metric([model], held.paused_since or 0)
            circuit.add_metric([model], 0 if held.circuit_since is None else 1)
            circuit_since.add_metric([model], held.circuit_since or 0)
        drained_since = GaugeMetricFamily(
            "mlx_medic_node_drained_since_timestamp_seconds",
            "Unix time `mlx-medic drain` drained the node (its models paused and stopped"
            " until `mlx-medic undrain` after its reboot), 0 while it is not drained.",
            labels=["node"],
        )
        for node in self.nodes:
            drained_since.add_metric([node], self._last_drains.get(node, 0))
        return [paused, paused_since, circuit, circuit_since, drained_since]
