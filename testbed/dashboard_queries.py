"""The dashboards' panel queries as Grafana runs them with every variable set to "All":
what tests/test_dashboards_live.py and the whole loop (`Loop.dashboard_orphans`) ask a
real Prometheus."""

from __future__ import annotations

from typing import Any

# Grafana's variables, as a dashboard set to "All" and a short time range expands them.
VARIABLES = {"$node": ".+", "$model": ".+", "$__rate_interval": "30s", "$__range": "10m"}


def panel_targets(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel, rows' panels included."""
    return [
        (inner.get("title", ""), target["expr"])
        for panel in board["panels"]
        for inner in [panel, *panel.get("panels", [])]
        for target in inner.get("targets", [])
    ]


def expand(query: str) -> str:
    """The query with every variable replaced by its "All" value."""
    for variable, value in VARIABLES.items():
        query = query.replace(variable, value)
    return query
