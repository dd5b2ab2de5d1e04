"""The serve collector on the head: the backend the current run serves on and the pin,
from the wrapper's record and the durable choice; the wrapper's state (a SIGKILLed one is
failed); its failed starts; how long a run has left the service stopped. Only for the
models this node heads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.serve import ServeCollector
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.model_lock import process_start_time
from mlx_medic.serve.record import ServeRecord, write_serve_record
from mlx_medic.state.backend_choice import write_backend_choice
from mlx_medic.state.service_stop import record_service_stop

INVENTORY = """\
nodes:
  n1: {ssh: 127.0.0.2}
  n2: {ssh: 127.0.0.3}
models:
  m1:
    model: /models/m1
    nodes: [n1, n2]
    port: 8080
    service: {manager: supervisord, label: m1}
    backends: {jaccl: {hostfile: /etc/jaccl.json}, ring: {hostfile: /etc/ring.json}}
  m2:
    model: /models/m2
    nodes: [n2, n1]
    port: 8081
    service: {manager: supervisord, label: m2}
    backends: {ring: {hostfile: /etc/ring.json}}
"""


def scrape(tmp_path: Path, node: str = "n1", now: float = 1000.0) -> list[object]:
    context = ExporterContext(
        node=node, inventory=parse_inventory(INVENTORY), state_dir=tmp_path, clock=lambda: now
    )
    return list(ScrapeCollector([ServeCollector(context)], node=node).collect())


def value(families: list[object], name: str, **labels: str) -> float | None:
    return sample_value(families, name, {"node": "n1", **labels})


def me(state: str = "serving", **changes: object) -> ServeRecord:
    return ServeRecord(
        "r1",
        os.getpid(),
        process_start_time(os.getpid()),
        state,  # type: ignore[arg-type]
        **changes,
    )


def test_the_backend_the_live_run_serves_on_is_1_and_the_others_0(tmp_path: Path) -> None:
    write_serve_record(tmp_path, "m1", me(backend="ring", failed_starts=2))
    families = scrape(tmp_path)
    assert value(families, "mlx_serve_backend", model="m1", backend="ring") == 1
    assert value(families, "mlx_serve_backend", model="m1", backend="jaccl") == 0
    assert value(families, "mlx_serve_state", model="m1", state="serving") == 1
    assert value(families, "mlx_serve_state", model="m1", state="failed") == 0
    assert value(families, "mlx_serve_failed_starts_total", model="m1") == 2


def test_models_headed_elsewhere_are_not_served_here(tmp_path: Path) -> None:
    assert value(scrape(tmp_path), "mlx_serve_backend", model="m2", backend="ring") is None


def test_a_sigkilled_wrapper_recorded_as_serving_is_failed_and_serves_no_backend(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_serve_record(tmp_path, "m1", ServeRecord("r1", gone.pid, 1.0, "serving", backend="ring"))
    families = scrape(tmp_path)
    assert value(families, "mlx_serve_state", model="m1", state="failed") == 1
    assert value(families, "mlx_serve_state", model="m1", state="serving") == 0
    assert value(families, "mlx_serve_backend", model="m1", backend="ring") == 0


def test_before_any_serve_every_state_is_0_and_auto_pins_nothing(tmp_path: Path) -> None:
    families = scrape(tmp_path)
    for state in ("starting", "serving", "failed", "stopped"):
        assert value(families, "mlx_serve_state", model="m1", state=state) == 0
    assert value(families, "mlx_serve_backend_pinned", model="m1", backend="ring") == 0
    assert value(families, "mlx_serve_failed_starts_total", model="m1") == 0
    assert value(families, "mlx_service_stopped_since_seconds", model="m1") == 0


def test_a_pin_and_a_service_left_stopped_are_served(tmp_path: Path) -> None:
    write_backend_choice(tmp_path, "m1", "ring", by="remediator run 4", reason="JACCL failed")
    record_service_stop(tmp_path, "m1", "remediator run 4", "recover", now=400.0)
    families = scrape(tmp_path, now=1000.0)
    assert value(families, "mlx_serve_backend_pinned", model="m1", backend="ring") == 1
    assert value(families, "mlx_serve_backend_pinned", model="m1", backend="jaccl") == 0
    assert value(families, "mlx_service_stopped_since_seconds", model="m1") == 600


def test_a_node_whose_reboot_the_last_start_needs_is_served_once_each(tmp_path: Path) -> None:
    """A survivor of SIGKILL there holds the model's port: the reboot alert names the node."""
    write_serve_record(tmp_path, "m1", me("failed", reboot=("n1", "n2", "n1")))
    families = scrape(tmp_path)
    reboots = {
        (s.labels["model"], s.labels["reboot_node"]): s.value
        for f in families
        for s in getattr(f, "samples", [])
        if s.name == "mlx_serve_reboot_needed"
    }
    assert reboots == {("m1", "n1"): 1.0, ("m1", "n2"): 1.0}
    assert value(families, "mlx_serve_reboot_needed", model="m1", reboot_node="n2") == 1


def test_no_reboot_needed_is_no_series(tmp_path: Path) -> None:
    write_serve_record(tmp_path, "m1", me("serving", backend="ring"))
    families = scrape(tmp_path)
    assert not [
        s
        for f in families
        for s in getattr(f, "samples", [])
        if s.name == "mlx_serve_reboot_needed"
    ]
