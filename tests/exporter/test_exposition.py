"""/metrics without prometheus_client.exposition (it imports ssl, http.server, urllib):
the exporter's encoder and format choice give client_python's bytes and content types,
and its server answers as tests/test_exporter_cli.py expects, errors included."""

from __future__ import annotations

import argparse
import gzip
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import exposition as reference
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from mlx_medic.exporter import exposition
from mlx_medic.exporter.main import add_arguments, build, make_registry
from mlx_medic.exporter.web import MetricsServer


class Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def every_kind() -> CollectorRegistry:
    gauge = GaugeMetricFamily("g", "help with \\ and\nnewline", labels=["a", "b"])
    gauge.add_metric(['quote " and \\', "é\nx"], 1.5, timestamp=12.5)
    gauge.add_metric(["x", "y"], float("inf"))
    counter = CounterMetricFamily("c", "a counter", labels=["k"], created=100.0)
    counter.add_metric(["v"], 3, created=1.25)
    histogram = HistogramMetricFamily("h", "a histogram", labels=["k"])
    histogram.add_metric(["v"], [("1.0", 1), ("+Inf", 2)], 3.5)
    gauge_histogram = GaugeHistogramMetricFamily("gh", "a gauge histogram")
    gauge_histogram.add_metric([], [("1.0", 1), ("+Inf", 2)], 3.5)
    summary = SummaryMetricFamily("s", "a summary", count_value=2, sum_value=1.0)
    info = InfoMetricFamily("i", "an info", value={"version": "1"})
    stateset = StateSetMetricFamily("st", "a stateset", value={"on": True, "off": False})
    unknown = UnknownMetricFamily("u", "an unknown", value=7)
    dotted = GaugeMetricFamily("name.with.dots", "a UTF-8 name", labels=["lab.el"])
    dotted.add_metric(["v"], 1)
    families = [gauge, counter, histogram, gauge_histogram, summary, info, stateset, unknown]
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(Families([*families, dotted]))
    return registry


ACCEPT = [
    None,
    "",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
    "text/plain; version=1.0.0; escaping=nonsense",
    "application/openmetrics-text",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/json, text/plain; version=1.0.0",
]


@pytest.mark.parametrize("accept", ACCEPT)
def test_each_accept_header_gets_client_pythons_format_and_bytes(accept: str | None) -> None:
    registry = every_kind()
    ours, ours_type = exposition.choose_encoder(accept)
    theirs, their_type = reference.choose_encoder(accept)  # type: ignore[arg-type]
    assert ours_type == their_type
    assert ours(registry) == theirs(registry)


def test_the_exporters_own_scrape_encodes_as_client_python_does() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _context, scrape = build(parser.parse_args(["--collector.service.interval", "300"]))
    try:
        families = Families(list(make_registry(scrape).collect()))  # one scrape, held
    finally:
        scrape.close()
    for accept in ACCEPT:
        ours, theirs = exposition.choose_encoder(accept)[0], reference.choose_encoder(accept)[0]  # type: ignore[arg-type]
        assert ours(families) == theirs(families)  # type: ignore[arg-type]
    assert b"mlx_medic_collector_success" in exposition.generate_latest(families)


def test_gzip_and_name_filter_as_client_python() -> None:
    registry = every_kind()
    headers, body = exposition.bake(registry, None, "deflate, gzip;q=0.5", ["g", "c_total"])
    assert headers == [
        ("Content-Type", exposition.CONTENT_TYPE_PLAIN_0_0_4),
        ("Content-Encoding", "gzip"),
    ]
    status, _, theirs = reference._bake_output(  # type: ignore[attr-defined]
        registry, None, "gzip", {"name[]": ["g", "c_total"]}, False
    )
    assert status == "200 OK" and gzip.decompress(body) == gzip.decompress(theirs)
    assert exposition.bake(registry, None, "br", None)[1] == reference.generate_latest(registry)


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    served = MetricsServer("127.0.0.1", 0)
    served.registry = every_kind()
    served.landing = b"<html>landing</html>"
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()


def exchange(server: MetricsServer, request: bytes) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert int(headers["Content-Length"]) == len(body)
    return status, headers, body


def test_metrics_and_the_landing_page_are_served(server: MetricsServer) -> None:
    status, headers, body = exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.0 200 OK" and headers["Connection"] == "close"
    assert headers["Content-Type"] == exposition.CONTENT_TYPE_PLAIN_0_0_4
    assert body == reference.generate_latest(server.registry)  # type: ignore[arg-type]
    status, headers, body = exchange(server, b"GET /?x=1 HTTP/1.0\r\n\r\n")
    assert status == "HTTP/1.0 200 OK" and body == b"<html>landing</html>"
    assert headers["Content-Type"] == "text/html; charset=utf-8"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metricz HTTP/1.1\r\n\r\n", "HTTP/1.0 404 Not Found"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.0 501 Not Implemented"),
        (b"HEAD /metrics HTTP/1.1\r\n\r\n", "HTTP/1.0 501 Not Implemented"),
        (b"nonsense\r\n\r\n", "HTTP/1.0 400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", "HTTP/1.0 400 Bad Request"),
        (b"GET /" + b"x" * 70000 + b" HTTP/1.1\r\n\r\n", "HTTP/1.0 414 Request-URI Too Long"),
    ],
)
def test_bad_requests_are_answered_with_their_status(
    server: MetricsServer, request_bytes: bytes, status: str
) -> None:
    assert exchange(server, request_bytes)[0] == status


def test_the_exporter_maps_neither_tls_nor_client_pythons_http_stack() -> None:
    """bench/busy_node: ssl, http.server, urllib.request and OpenSSL's libcrypto (hashlib)
    are 10 MiB the exporter does not use; prometheus_client stays whole for other users."""
    code = (
        "import sys\n"
        "import mlx_medic.exporter.main, mlx_medic.health as health\n"
        "import mlx_medic.exporter.collectors.memory, mlx_medic.node.room\n"
        "assert not health.probe_model('127.0.0.1', 9, timeout=2).up\n"
        "heavy = ('ssl', '_ssl', '_hashlib', 'http.client', 'http.server', 'urllib.request',\n"
        "         'prometheus_client.exposition', 'prometheus_client.core')\n"
        "print(*sorted(m for m in heavy if m in sys.modules))\n"
        "import prometheus_client.metrics_core as core\n"
        "from prometheus_client import Gauge, generate_latest\n"
        "import prometheus_client, ssl\n"
        "print(prometheus_client.Metric is core.Metric, callable(generate_latest),\n"
        "      ssl.PROTOCOL_TLS_CLIENT > 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.splitlines() == ["", "True True True"], result.stderr
