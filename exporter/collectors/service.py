"""`service`: is each model served from this node actually answering?

Probes run in one background thread, one after another, every
`--collector.service.interval` seconds (default 30; `MLX_MEDIC_SERVICE_INTERVAL` when
the flag is not given); scrapes only read the last result. Why not probe on scrape:
a hung server would then cost the scrape its whole timeout, and every extra scrape
(two Prometheus replicas, a curl by hand) would send another request to the model,
while concurrent requests can crash JACCL ranks (mlx-lm#1737). Here the request rate
is fixed by the interval, probes never overlap (health.py's lock, shared with any
remediator re-check in this process and, through the state dir, across processes),
and a scrape returns at once.

    mlx_model_up{model="glm-4_6-5b"} 1.0
    mlx_model_probe_duration_seconds{model="glm-4_6-5b"} 0.042
    mlx_model_probe_age_seconds{model="glm-4_6-5b"} 12.3
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlx_medic.exporter.background import PeriodicWorker
from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.exporter.settings import positive_seconds, setting
from mlx_medic.health import ProbeResult, probe_host, probe_model, shared_probe_lock_dir

log = logging.getLogger("mlx_medic.exporter.service")

DEFAULT_INTERVAL = 30.0
DEFAULT_TIMEOUT = 10.0

Probe = Callable[..., ProbeResult]


@dataclass(frozen=True)
class ServiceSettings:
    interval: float = setting(
        DEFAULT_INTERVAL,
        "seconds between rounds of probes",
        positive_seconds,
        env="MLX_MEDIC_SERVICE_INTERVAL",
        metavar="SECONDS",
    )
    timeout: float = setting(
        DEFAULT_TIMEOUT,
        "seconds a probe may take before the model reads down",
        positive_seconds,
        metavar="SECONDS",
    )


@dataclass(frozen=True)
class ProbeTarget:
    model: str
    host: str
    port: int


@dataclass(frozen=True)
class _Reading:
    result: ProbeResult
    finished_at: float  # monotonic


class ModelServiceCollector(Collector):
    """Reports the last background probe of each model whose head is this node."""

    name = "service"

    def __init__(
        self,
        targets: Iterable[ProbeTarget],
        *,
        interval: float = DEFAULT_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        probe: Probe = probe_model,
        lock_dir: Path | None = None,
        first_result_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ):
        self.targets = list(targets)
        self.interval = interval
        self.timeout = timeout
        self._probe = probe
        self._lock_dir = lock_dir
        self._clock = clock
        # Only the first scrape may wait (so `--once` shows a value), and only this long.
        self._first_wait = timeout + 1.0 if first_result_wait is None else first_result_wait
        self._readings: dict[str, _Reading] = {}
        self._readings_lock = threading.Lock()
        self._worker = PeriodicWorker("mlx-medic-probe", interval, self.probe_all_once)
        if start and self.targets:
            self.start()

    def start(self) -> None:
        self._worker.start()

    def probe_all_once(self) -> None:
        """One sequential round over every target (the background loop's body)."""
        for target in self.targets:
            if self._worker.stopping:
                return
            try:
                result = self._probe(
                    target.host, target.port, timeout=self.timeout, lock_dir=self._lock_dir
                )
            except Exception:
                log.exception(
                    "probe of model %s at %s:%d failed to run",
                    target.model,
                    target.host,
                    target.port,
                )
                continue
            if not result.conclusive:
                log.warning(
                    "model %s: %s; keeping the previous reading", target.model, result.reason
                )
                continue
            previous = self._readings.get(target.model)
            if previous is None or previous.result.up != result.up:
                level = logging.INFO if result.up else logging.WARNING
                log.log(
                    level,
                    "model %s on %s:%d is %s: %s",
                    target.model,
                    target.host,
                    target.port,
                    "up" if result.up else "down",
                    result.reason,
                )
            with self._readings_lock:
                self._readings[target.model] = _Reading(result, self._clock())

    def collect(self) -> Iterator[Metric]:
        if self._worker.started and self._first_wait > 0:
            self._worker.wait_first(self._first_wait)
            self._first_wait = 0.0
        up = GaugeMetricFamily(
            "mlx_model_up",
            "1 if the model completed a real 1-token request within the probe timeout at its"
            " last probe, else 0 (/health is not enough). Probed in the background, one probe"
            " at a time (--collector.service.interval and .timeout, shown on the exporter's"
            " landing page), so the value lags; mlx_model_probe_age_seconds says by how much.",
            labels=["model"],
        )
        duration = GaugeMetricFamily(
            "mlx_model_probe_duration_seconds",
            "How long the model's last probe took (connect to answer, or the timeout).",
            labels=["model"],
        )
        age = GaugeMetricFamily(
            "mlx_model_probe_age_seconds",
            "Seconds since the model's last probe finished.",
            labels=["model"],
        )
        now = self._clock()
        with self._readings_lock:
            readings = dict(self._readings)
        for target in self.targets:
            reading = readings.get(target.model)
            if reading is None:
                continue  # not probed yet: unknown, not down
            up.add_metric([target.model], 1.0 if reading.result.up else 0.0)
            duration.add_metric([target.model], reading.result.latency_seconds)
            age.add_metric([target.model], max(0.0, now - reading.finished_at))
        yield up
        yield duration
        yield age

    def close(self) -> None:
        self._worker.close(self.timeout + 2.0)


def targets_for(context: ExporterContext) -> list[ProbeTarget]:
    """Models whose head (rank 0, the only rank that serves HTTP) is this node."""
    return [
        ProbeTarget(model.name, probe_host(model.host), model.port)
        for model in context.models_here()
        if model.head == context.node
    ]


@register(
    "service",
    help="probe each model served from this node with a real 1-token request",
    settings=ServiceSettings,
)
def make(context: ExporterContext) -> Collector:
    settings = context.settings_for(ServiceSettings)
    targets = targets_for(context)
    # The node's login user's locks dir (state.layout), as every other prober there uses.
    lock_dir = (
        shared_probe_lock_dir(context.state_dir, context.prepare_state_dir()) if targets else None
    )
    return ModelServiceCollector(
        targets, interval=settings.interval, timeout=settings.timeout, lock_dir=lock_dir
    )
