"""The alerting rules for Prometheus, written to `rules/` beside prometheus.yml.

The shipped file (alerting-rules/mlx-medic.rules.yaml) is the source; it is package data
(mlx_medic/render/mlx-medic.rules.yaml, a link in a checkout, a copy in the wheel), so an
installed `mlx-medic render rules` needs no checkout. Without overrides
it is copied as it is, comments and all; `--rules.for ALERT=DURATION` and
`--rules.interval DURATION` write a copy with those `for:` and group evaluation
intervals, so a test (or a staging Prometheus) can shorten them without editing the
shipped file; `--rules.held-for DURATION` is how long a pause, an open circuit or a node's drain may
stay on before its alert warns (T25, 4h as shipped).
"""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePosixPath
from typing import Any

import yaml

from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site, check_duration

TARGET = "rules"
DIR = PurePosixPath("rules")
SOURCE: Traversable = files("mlx_medic.render") / "mlx-medic.rules.yaml"

# T25: the alert on a pause, an open circuit or a drain left on, and the series it reads.
HELD_ALERTS = {
    "MLXMedicPausedTooLong": "mlx_medic_paused_since_timestamp_seconds",
    "MLXMedicCircuitOpenTooLong": "mlx_medic_circuit_open_since_timestamp_seconds",
    "MLXMedicNodeDrainedTooLong": "mlx_medic_node_drained_since_timestamp_seconds",
}


def held_expr(series: str, seconds: float) -> str:
    """The expression of a HELD_ALERTS alert: on for more than `seconds` (0: it is not)."""
    return f"time() - ({series} > 0) > {seconds:.15g}"


def _held_for(duration: str, alerts: dict[str, Any]) -> None:
    """Every HELD_ALERTS alert the rules have warns after `duration` (a Prometheus one)."""
    seconds = _seconds(check_duration(duration, "--rules.held-for"))
    if not set(HELD_ALERTS) & set(alerts):
        raise RenderError(f"--rules.held-for: the rules have none of {', '.join(HELD_ALERTS)}")
    for name, series in HELD_ALERTS.items():
        if name in alerts:
            alerts[name]["expr"] = held_expr(series, seconds)


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _seconds(duration: str) -> float:
    """A checked Prometheus duration (1h30m, 4h) in seconds."""
    parts = re.findall(r"(\d+)(ms|[smhdwy])", duration)
    return sum(int(count) * _UNIT_SECONDS[unit] for count, unit in parts)


def _overridden(text: str, site: Site) -> str:
    rules: dict[str, Any] = yaml.safe_load(text)
    alerts = {
        rule["alert"]: rule
        for group in rules["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    unknown = sorted(set(site.rules.for_overrides) - set(alerts))
    if unknown:
        raise RenderError(f"--rules.for: no such alert in {site.rules.source}: {unknown}")
    for name, duration in site.rules.for_overrides.items():
        alerts[name]["for"] = check_duration(duration, f"--rules.for {name}")
    if site.rules.held_for is not None:
        _held_for(site.rules.held_for, alerts)
    if site.rules.interval is not None:
        interval = check_duration(site.rules.interval, "--rules.interval")
        for group in rules["groups"]:
            group["interval"] = interval
    note = (
        f"# {GENERATED}\n# From {site.rules.source.name} with overrides: for "
        f"{site.rules.for_overrides or 'none'}, interval {site.rules.interval or 'none'},"
        f" held-for {site.rules.held_for or 'none'}.\n"
    )
    return note + yaml.safe_dump(rules, sort_keys=False, width=100)


def render(site: Site) -> list[Rendered]:
    source = site.rules.source
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        what = (
            "the rules shipped with mlx-medic (reinstall it, or give --rules.file)"
            if source == SOURCE
            else "--rules.file"
        )
        raise RenderError(f"{what} {source}: cannot read ({exc.strerror or exc})") from None
    options = site.rules
    if options.for_overrides or options.interval is not None or options.held_for is not None:
        text = _overridden(text, site)
    return [Rendered(DIR / source.name, text)]
