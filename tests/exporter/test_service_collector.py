"""The service collector: mlx_model_up for models whose head is this node,
probed in the background so a scrape never waits on (or adds load to) a model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.service import ModelServiceCollector, ProbeTarget, make
from mlx_medic.health import ProbeResult, probe_model
from mlx_medic.inventory.load import parse_inventory
from testbed.net import free_port
from tests.exporter.probe_servers import CountingCompletionServer, silent_listener
from tests.exporter.real_mlx_server import mlx_lm_server


def inventory_text(port_a: int, port_b: int) -> str:
    return f"""
nodes:
  head: {{ssh: 127.0.0.2}}
  peer: {{ssh: 127.0.0.3}}
models:
  alpha:
    model: /models/alpha
    nodes: [head, peer]
    port: {port_a}
    service: {{manager: supervisord, label: alpha}}
    backends: {{ring: {{hostfile: /etc/alpha.ring.json}}}}
  beta:
    model: /models/beta
    nodes: [peer, head]
    port: {port_b}
    service: {{manager: supervisord, label: beta}}
    backends: {{ring: {{hostfile: /etc/beta.ring.json}}}}
"""


@pytest.fixture
def collectors() -> Iterator[list[ModelServiceCollector]]:
    """Collectors made by a test; their probe threads are stopped afterwards."""
    made: list[ModelServiceCollector] = []
    yield made
    for collector in made:
        collector.close()


def up_of(collector: ModelServiceCollector, model: str) -> float | None:
    return sample_value(list(collector.collect()), "mlx_model_up", {"model": model})


def wait_for_reading(
    collector: ModelServiceCollector, model: str, want: float, within: float = 30.0
) -> float | None:
    deadline = time.monotonic() + within
    value = up_of(collector, model)
    while value != want and time.monotonic() < deadline:
        time.sleep(0.05)
        value = up_of(collector, model)
    return value


# --- which models -------------------------------------------------------------


def test_only_models_whose_head_is_this_node_are_probed(tmp_path, collectors):
    with CountingCompletionServer() as alpha, CountingCompletionServer() as beta:
        inventory = parse_inventory(inventory_text(alpha.port, beta.port))
        collector = make(ExporterContext(node="head", inventory=inventory, state_dir=tmp_path))
        assert isinstance(collector, ModelServiceCollector)
        collectors.append(collector)
        families = list(ScrapeCollector([collector]).collect())
    assert [t.model for t in collector.targets] == ["alpha"]
    assert sample_value(families, "mlx_model_up", {"model": "alpha"}) == 1.0
    assert sample_value(families, "mlx_model_up", {"model": "beta"}) is None
    assert beta.requests == 0
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "service"}) == 1.0
    assert (tmp_path / "locks").is_dir()  # probes share a file lock with other processes


def test_a_model_listening_on_every_address_is_probed_on_loopback(tmp_path, collectors):
    text = inventory_text(free_port(), free_port()).replace(
        "    port: ", "    host: 0.0.0.0\n    port: ", 1
    )
    inventory = parse_inventory(text)
    collector = make(ExporterContext(node="head", inventory=inventory, state_dir=tmp_path))
    collectors.append(collector)
    assert [(t.host, t.model) for t in collector.targets] == [("127.0.0.1", "alpha")]


def test_without_an_inventory_nothing_is_probed_or_reported(tmp_path, collectors):
    collector = make(ExporterContext(node="anything", inventory=None, state_dir=tmp_path))
    collectors.append(collector)
    families = list(ScrapeCollector([collector]).collect())
    assert not [
        s for f in families for s in getattr(f, "samples", []) if s.name.startswith("mlx_model_")
    ]
    assert not (tmp_path / "locks").exists()


# --- up, down, hung -----------------------------------------------------------


@pytest.mark.slow
def test_a_real_mlx_lm_server_reads_up_and_after_it_is_stopped_reads_down(
    tiny_model, tmp_path, collectors
):
    with mlx_lm_server(tiny_model, tmp_path / "server.log") as server:
        collector = ModelServiceCollector(
            [ProbeTarget("tiny", "127.0.0.1", server.port)], interval=0.5, timeout=30
        )
        collectors.append(collector)
        assert wait_for_reading(collector, "tiny", 1.0) == 1.0
        server.stop()
        assert wait_for_reading(collector, "tiny", 0.0) == 0.0
    families = list(collector.collect())
    duration = sample_value(families, "mlx_model_probe_duration_seconds", {"model": "tiny"})
    age = sample_value(families, "mlx_model_probe_age_seconds", {"model": "tiny"})
    assert duration is not None and duration >= 0
    assert age is not None and age >= 0


def test_a_server_that_accepts_but_never_answers_reads_down_after_the_timeout(collectors):
    with silent_listener() as port:
        collector = ModelServiceCollector(
            [ProbeTarget("hung", "127.0.0.1", port)], interval=0.2, timeout=0.5, first_result_wait=0
        )
        collectors.append(collector)
        assert wait_for_reading(collector, "hung", 0.0, within=10) == 0.0
        families = list(collector.collect())
    duration = sample_value(families, "mlx_model_probe_duration_seconds", {"model": "hung"})
    assert duration is not None and duration >= 0.5


def test_a_model_not_probed_yet_is_absent_not_down(collectors):
    release = threading.Event()

    def stuck_probe(host: str, port: int, **kwargs: object) -> ProbeResult:
        release.wait(30)
        return ProbeResult(True, "ok", 0.01)

    collector = ModelServiceCollector(
        [ProbeTarget("slow", "127.0.0.1", 9)],
        probe=stuck_probe,
        interval=60,
        timeout=1,
        first_result_wait=0,
    )
    collectors.append(collector)
    try:
        assert up_of(collector, "slow") is None
    finally:
        release.set()


def test_a_scrape_during_a_hung_probe_returns_the_last_reading_without_waiting(collectors):
    # The probe blocks until the test releases it AFTER the scrape returned; a
    # scrape that waited on the probe would deadlock here (pytest-timeout).
    answers = [ProbeResult(True, "ok", 0.01)]
    probing = threading.Event()
    release = threading.Event()

    def probe(host: str, port: int, **kwargs: object) -> ProbeResult:
        if answers:
            return answers.pop()
        probing.set()
        release.wait(60)
        return ProbeResult(False, "no complete answer", 10.0)

    collector = ModelServiceCollector(
        [ProbeTarget("m", "127.0.0.1", 9)], probe=probe, interval=0.01, timeout=10
    )
    collectors.append(collector)
    assert probing.wait(10)
    try:
        assert up_of(collector, "m") == 1.0  # the last completed reading
    finally:
        release.set()
    assert wait_for_reading(collector, "m", 0.0) == 0.0


def test_the_first_scrape_waits_briefly_for_the_first_probe_so_once_mode_has_a_value(collectors):
    def probe(host: str, port: int, **kwargs: object) -> ProbeResult:
        time.sleep(0.2)
        return ProbeResult(True, "ok", 0.2)

    collector = ModelServiceCollector(
        [ProbeTarget("m", "127.0.0.1", 9)], probe=probe, interval=60, timeout=5
    )
    collectors.append(collector)
    assert up_of(collector, "m") == 1.0


def test_an_inconclusive_probe_keeps_the_previous_reading(collectors):
    answers = [
        ProbeResult(False, "not probed: busy", 0.0, conclusive=False),
        ProbeResult(True, "ok", 0.01),
    ]
    collector = ModelServiceCollector(
        [ProbeTarget("m", "127.0.0.1", 9)], probe=lambda h, p, **k: answers.pop(), start=False
    )
    collector.probe_all_once()
    collector.probe_all_once()
    assert up_of(collector, "m") == 1.0


def test_a_probe_that_raises_is_logged_and_the_loop_keeps_going(caplog, collectors):
    calls = []

    def probe(host: str, port: int, **kwargs: object) -> ProbeResult:
        calls.append(host)
        if len(calls) == 1:
            raise OSError("lock dir vanished")
        return ProbeResult(True, "ok", 0.01)

    collector = ModelServiceCollector(
        [ProbeTarget("m", "127.0.0.1", 9)],
        probe=probe,
        interval=0.05,
        timeout=1,
        first_result_wait=0,
    )
    collectors.append(collector)
    assert wait_for_reading(collector, "m", 1.0) == 1.0
    assert "probe of model m at 127.0.0.1:9 failed to run" in caplog.text


def test_help_is_the_same_whatever_the_settings_and_the_age_is_a_series_of_its_own():
    helps = []
    for interval, timeout in ((30, 10), (300, 60)):
        collector = ModelServiceCollector([], interval=interval, timeout=timeout, start=False)
        helps.append({f.name: f.documentation for f in collector.collect()})
    assert helps[0] == helps[1]
    assert "mlx_model_probe_age_seconds" in helps[0]["mlx_model_up"]
    assert "mlx_model_probe_age_seconds" in helps[0]


# --- never two probes at once -------------------------------------------------


def test_racing_scrapes_and_a_remediator_recheck_never_overlap_probes(collectors):
    with CountingCompletionServer(delay=0.1) as server:
        collector = ModelServiceCollector(
            [ProbeTarget("m", "127.0.0.1", server.port)], interval=0.01, timeout=5
        )
        collectors.append(collector)
        scrape = ScrapeCollector([collector])
        rechecks: list[ProbeResult] = []

        def scrape_a_lot() -> None:
            for _ in range(20):
                list(scrape.collect())

        def recheck() -> None:  # what the remediator does before acting
            for _ in range(3):
                rechecks.append(probe_model("127.0.0.1", server.port, timeout=5, lock_wait=30))

        threads = [threading.Thread(target=scrape_a_lot) for _ in range(3)]
        threads.append(threading.Thread(target=recheck))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        collector.close()
    assert all(r.up for r in rechecks)
    assert server.requests >= 4
    assert server.max_in_flight == 1


def test_scrapes_do_not_add_requests_to_the_model(collectors):
    with CountingCompletionServer() as server:
        collector = ModelServiceCollector(
            [ProbeTarget("m", "127.0.0.1", server.port)], interval=3600, timeout=5
        )
        collectors.append(collector)
        for _ in range(10):
            assert up_of(collector, "m") == 1.0
    assert server.requests == 1


def test_the_exporter_factory_degrades_to_in_process_locking_when_state_dir_is_unusable(
    tmp_path: Path, caplog, collectors
):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    inventory = parse_inventory(inventory_text(free_port(), free_port()))
    collector = make(ExporterContext(node="head", inventory=inventory, state_dir=blocker))
    collectors.append(collector)
    assert "probes are serialized within this process only" in caplog.text
    assert up_of(collector, "alpha") == 0.0  # nothing listens: refused, still a reading
