"""`serve`: what the serve wrapper records on the head about each model it runs there:
the backend the current run serves on, the durable backend pin, the wrapper's state and
failed starts, and how long a run has left the model's service stopped.

Served by the head's exporter because the head keeps these records (the serve record,
backend_choice, service_stop): one owner for each name. Only for models whose head is
this node.

    mlx_serve_backend{model="m1",backend="ring"} 1.0
    mlx_serve_backend_pinned{model="m1",backend="ring"} 0.0
    mlx_serve_state{model="m1",state="serving"} 1.0
    mlx_serve_failed_starts_total{model="m1"} 2.0
    mlx_service_stopped_since_seconds{model="m1"} 0.0
    mlx_serve_reboot_needed{model="m1",reboot_node="n2"} 1.0
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.serve.record import (
    LIVE_STATES,
    SERVE_STATES,
    ServeRecord,
    read_serve_record,
    wrapper_alive,
)
from mlx_medic.state.backend_choice import read_backend_choice
from mlx_medic.state.service_stop import read_service_stop

BACKEND_HELP = (
    "1 for the backend the model's current run serves on (from the serve wrapper's record on"
    " the head), 0 for the model's other backends; all 0 while it does not serve."
)
PINNED_HELP = (
    "1 for the backend the model's durable choice pins (set by the remediator or `mlx-medic"
    " backend MODEL ring|jaccl`), 0 otherwise; all 0 under `auto` (JACCL first, then ring)."
)
STATE_HELP = (
    "The serve wrapper's state for the model, one series per state (starting, serving,"
    " failed, stopped), 1 for the current one; a wrapper recorded as starting or serving"
    " whose process is gone (SIGKILLed) counts as failed. All 0 before the first serve."
)
FAILED_STARTS_HELP = (
    "Starts of the model by the serve wrapper that ended without serving: no backend"
    " started, a node did not answer, a process survived the start sweep that is not in"
    " uninterruptible sleep, or one that survives SIGKILL holds the model's port (see"
    " mlx_serve_reboot_needed). Survivors that do not hold the port are started around."
)
STOPPED_HELP = (
    "Seconds since a run (the remediator, a person) stopped the model's service and left"
    " it stopped, from the head's service-stop record; 0 when no such record exists."
)

REBOOT_HELP = (
    "1 for each node whose reboot the model's last start needs, from the serve record on"
    " the head: a process there that survives SIGKILL holds the model's port, so no start"
    " can listen on it; no series when no reboot is needed."
)


def effective_state(record: ServeRecord | None) -> str | None:
    if record is None:
        return None
    if record.state in LIVE_STATES and not wrapper_alive(record):
        return "failed"
    return record.state


class ServeCollector(Collector):
    name = "serve"

    def __init__(self, context: ExporterContext):
        self._context = context

    def collect(self) -> Iterable[Metric]:
        context = self._context
        models = [m for m in context.models_here() if m.head == context.node]
        backend = GaugeMetricFamily("mlx_serve_backend", BACKEND_HELP, labels=["model", "backend"])
        pinned = GaugeMetricFamily(
            "mlx_serve_backend_pinned", PINNED_HELP, labels=["model", "backend"]
        )
        state = GaugeMetricFamily("mlx_serve_state", STATE_HELP, labels=["model", "state"])
        failed = CounterMetricFamily(
            "mlx_serve_failed_starts", FAILED_STARTS_HELP, labels=["model"]
        )
        stopped = GaugeMetricFamily(
            "mlx_service_stopped_since_seconds", STOPPED_HELP, labels=["model"]
        )
        reboot = GaugeMetricFamily(
            "mlx_serve_reboot_needed", REBOOT_HELP, labels=["model", "reboot_node"]
        )
        for model in models:
            record = read_serve_record(context.state_dir, model.name)
            now_state = effective_state(record)
            choice = read_backend_choice(context.state_dir, model.name)
            for name, _ in model.backends.in_order():
                serving = now_state == "serving" and record is not None and record.backend == name
                backend.add_metric([model.name, name], 1.0 if serving else 0.0)
                pinned.add_metric([model.name, name], 1.0 if choice.choice == name else 0.0)
            for value in SERVE_STATES:
                state.add_metric([model.name, value], 1.0 if now_state == value else 0.0)
            failed.add_metric([model.name], float(record.failed_starts if record else 0))
            stop = read_service_stop(context.state_dir, model.name)
            stopped.add_metric([model.name], max(0.0, context.clock() - stop.at) if stop else 0.0)
            for node in dict.fromkeys(record.reboot if record else ()):
                reboot.add_metric([model.name, node], 1.0)
        yield from (backend, pinned, state, failed, stopped, reboot)


@register(
    "serve",
    help="the serve wrapper's backend, state and failed starts, the backend pin"
    " and a service left stopped, for the models this node heads",
)
def make(context: ExporterContext) -> Collector:
    return ServeCollector(context)
