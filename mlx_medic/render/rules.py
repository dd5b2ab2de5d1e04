"""The alerting rules for Prometheus, written to `rules/` beside prometheus.yml.

The shipped file (alerting-rules/mlx-medic.rules.yaml) is the source; it is package data
(mlx_medic/render/mlx-medic.rules.yaml, a link in a checkout, a copy in the wheel), so an
installed `mlx-medic render rules` needs no checkout. Without overrides
it is copied as it is, comments and all; `--rules.for ALERT=DURATION` and
`--rules.interval DURATION` write a copy with those `for:` and group evaluation
intervals, so a test (or a staging Prometheus) can shorten them without editing the
shipped file.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePosixPath
from typing import Any

import yaml

from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site, check_duration

TARGET = "rules"
DIR = PurePosixPath("rules")
SOURCE: Traversable = files("mlx_medic.render") / "mlx-medic.rules.yaml"


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
    if site.rules.interval is not None:
        interval = check_duration(site.rules.interval, "--rules.interval")
        for group in rules["groups"]:
            group["interval"] = interval
    note = (
        f"# {GENERATED}\n# From {site.rules.source.name} with overrides: for "
        f"{site.rules.for_overrides or 'none'}, interval {site.rules.interval or 'none'}.\n"
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
    if site.rules.for_overrides or site.rules.interval is not None:
        text = _overridden(text, site)
    return [Rendered(DIR / source.name, text)]
