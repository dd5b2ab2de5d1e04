"""The Prometheus config: every node's exporter (at its inventory address), the
remediator, Alertmanager, and the rule files rendered beside it (`rules/`)."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

from mlx_medic.render import services
from mlx_medic.render.files import Rendered, RenderError, Site, check_duration
from mlx_medic.render.yaml_files import dump

TARGET = "prometheus"
FILE = PurePosixPath("prometheus.yml")
RULES_GLOB = "rules/*.yaml"  # relative to this file's dir: where `render rules` writes


def remediator_target(url: str) -> tuple[str, str]:
    """(scheme, host:port) of `--remediator.url`."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.path not in {"", "/"}:
        raise RenderError(
            f"--remediator.url {url!r}: give the remediator's base URL, e.g."
            " https://remediator.example:10901"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, services.host_port(parts.hostname, port)


def global_settings(site: Site) -> dict[str, str]:
    """15 s scrapes and evaluations, or `--prometheus.interval` for both (a test's short
    loop); a scrape never outlasts its interval."""
    if site.prometheus_interval is None:
        return {"scrape_interval": "15s", "evaluation_interval": "15s"}
    interval = check_duration(site.prometheus_interval, "--prometheus.interval")
    return {
        "scrape_interval": interval,
        "evaluation_interval": interval,
        "scrape_timeout": interval,
    }


def render(site: Site) -> list[Rendered]:
    url = site.need(site.remediator_url, "--remediator.url")
    alertmanager = site.need(site.alertmanager, "--alertmanager.address")
    scheme, remediator = remediator_target(url)
    exporters = [services.exporter_listen(n) for n in site.inventory.nodes]
    data = {
        "global": global_settings(site),
        "rule_files": [RULES_GLOB],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "mlx-medic-exporter", "static_configs": [{"targets": exporters}]},
            {
                "job_name": "mlx-medic-remediator",
                "scheme": scheme,
                "authorization": {
                    "type": "Bearer",
                    "credentials_file": site.prometheus_credentials_file,
                },
                "static_configs": [{"targets": [remediator]}],
            },
        ],
    }
    comment = (
        "Check with: promtool check config prometheus.yml (the credentials file must exist).\n"
        "One exporter per node, at its inventory address (nodes.*.ssh) on"
        f" :{services.EXPORTER_PORT}.\nEach names its node itself: every series carries"
        " `node`, its inventory name; nothing\n"
        "here maps an address back to a node. The remediator serves its metrics behind the\n"
        "webhook's credentials (add tls_config.ca_file for a private CA). The rule files are\n"
        "in rules/ beside this file (mlx-medic render rules)."
    )
    return [Rendered(FILE, dump(data, comment))]
