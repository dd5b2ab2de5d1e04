"""What /metrics answers: client_python's formats, chosen as its `MetricsHandler` chooses
them, without importing `prometheus_client.exposition`.

That module imports `ssl` (libssl, libcrypto), `urllib.request`, `http.server` and
`wsgiref` for its push gateway and servers, about 10 MiB of the exporter's resident memory
(bench/busy_node); the exporter uses none of them. The OpenMetrics encoder is client_python's
own (`prometheus_client.openmetrics.exposition`, which imports none of that); the
Prometheus text encoder, the Accept negotiation and the gzip test below are
`prometheus_client.exposition`'s (0.26.0, Apache-2.0: `generate_latest`, `choose_encoder`,
`_get_version`, `_get_escaping`, `gzip_accepted`, `_bake_output`), kept byte for byte in
what they produce: tests/exporter/test_exposition.py compares both on the exporter's
registry and on every Accept header it knows.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from functools import partial

from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString, parse_version

CONTENT_TYPE_PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_PLAIN_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"


Encoder = Callable[[Collector], bytes]


def _label_value(value: str) -> str:
    return openmetrics._escape(value, openmetrics.ALLOWUTF8, False)  # type: ignore[arg-type]


def _sample_line(sample: Sample, escaping: str) -> str:
    if sample.labels:
        labelstr = ",".join(
            f'{openmetrics.escape_label_name(k, escaping)}="{_label_value(v)}"'
            for k, v in sorted(sample.labels.items())
        )
    else:
        labelstr = ""
    timestamp = ""
    if sample.timestamp is not None:
        timestamp = f" {int(float(sample.timestamp) * 1000):d}"  # type: ignore[arg-type]
    name = openmetrics.escape_metric_name(sample.name, escaping)
    value = floatToGoString(sample.value)
    if escaping != openmetrics.ALLOWUTF8 or openmetrics._is_valid_legacy_metric_name(sample.name):
        if labelstr:
            labelstr = f"{{{labelstr}}}"
        return f"{name}{labelstr} {value}{timestamp}\n"
    maybe_comma = "," if labelstr else ""
    return f"{{{name}{maybe_comma}{labelstr}}} {value}{timestamp}\n"


def _help(name: str, documentation: str, escaping: str) -> str:
    text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {openmetrics.escape_metric_name(name, escaping)} {text}\n"


# OpenMetrics types, as the Prometheus text format names them.
_TEXT_TYPES = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}


def generate_latest(registry: Collector, escaping: str = openmetrics.UNDERSCORES) -> bytes:
    """The Prometheus text format of everything `registry` collects."""
    output: list[str] = []
    for metric in registry.collect():
        om_samples: dict[str, list[str]] = {}
        try:
            mname = metric.name
            if metric.type == "counter":
                mname += "_total"
            elif metric.type == "info":
                mname += "_info"
            mtype = _TEXT_TYPES.get(metric.type, metric.type)
            output.append(_help(mname, metric.documentation, escaping))
            output.append(f"# TYPE {openmetrics.escape_metric_name(mname, escaping)} {mtype}\n")
            for sample in metric.samples:
                for suffix in ("_created", "_gsum", "_gcount"):
                    if sample.name == metric.name + suffix:
                        # OpenMetrics specific sample, put in a gauge at the end.
                        om_samples.setdefault(suffix, []).append(_sample_line(sample, escaping))
                        break
                else:
                    output.append(_sample_line(sample, escaping))
        except Exception as exception:
            exception.args = (exception.args or ("",)) + (metric,)
            raise
        for suffix, lines in sorted(om_samples.items()):
            name = metric.name + suffix
            output.append(_help(name, metric.documentation, escaping))
            output.append(f"# TYPE {openmetrics.escape_metric_name(name, escaping)} gauge\n")
            output.extend(lines)
    return "".join(output).encode("utf-8")


def _parameter(tokens: list[str], wanted: str) -> str:
    for token in tokens:
        if "=" in token:
            key, value = token.strip().split("=", 1)
            if key == wanted:
                return value
    return ""


def _escaping(tokens: list[str]) -> str:
    for token in tokens:
        if "=" not in token:
            continue
        key, value = token.strip().split("=", 1)
        if key != "escaping":
            continue
        known = (openmetrics.ALLOWUTF8, openmetrics.UNDERSCORES, openmetrics.DOTS)
        return value if value in (*known, openmetrics.VALUES) else openmetrics.UNDERSCORES
    return openmetrics.UNDERSCORES


def choose_encoder(accept_header: str | None) -> tuple[Encoder, str]:
    """The encoder and content type for an Accept header, as client_python chooses."""
    for accepted in (accept_header or "").split(","):
        tokens = accepted.split(";")
        kind = tokens[0].strip()
        if kind == "application/openmetrics-text":
            version = _parameter(tokens, "version")
            escaping = _escaping(tokens)
            if not version:
                return (
                    partial(
                        openmetrics.generate_latest,
                        escaping=openmetrics.UNDERSCORES,
                        version="1.0.0",
                    ),
                    openmetrics.CONTENT_TYPE_LATEST,
                )
            if parse_version(version) >= (1, 0, 0):
                return (
                    partial(openmetrics.generate_latest, escaping=escaping, version=version),
                    f"application/openmetrics-text; version={version}; charset=utf-8;"
                    f" escaping={escaping}",
                )
        elif kind == "text/plain":
            version = _parameter(tokens, "version")
            escaping = _escaping(tokens)
            if version and parse_version(version) >= (1, 0, 0):
                return (
                    partial(generate_latest, escaping=escaping),
                    f"{CONTENT_TYPE_PLAIN_1_0_0}; escaping={escaping}",
                )
    return generate_latest, CONTENT_TYPE_PLAIN_0_0_4


def gzip_accepted(accept_encoding_header: str | None) -> bool:
    return any(
        accepted.split(";")[0].strip().lower() == "gzip"
        for accepted in (accept_encoding_header or "").split(",")
    )


def bake(
    registry: CollectorRegistry,
    accept: str | None,
    accept_encoding: str | None,
    names: list[str] | None,
) -> tuple[list[tuple[str, str]], bytes]:
    """(headers, body) of a /metrics answer: the format `accept` asks for, only the
    families named in `names` (`name[]`) when given, gzipped when accepted."""
    encoder, content_type = choose_encoder(accept)
    output = encoder(registry if names is None else registry.restricted_registry(names))
    headers = [("Content-Type", content_type)]
    if gzip_accepted(accept_encoding):
        output = gzip.compress(output)
        headers.append(("Content-Encoding", "gzip"))
    return headers, output
