"""The alerting rules: valid for promtool, unit-tested alert by alert, mixin-styled, linked to
runbooks that exist, and built only on the metric contract."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.config import RoutingConfig
from tests.promql_names import (
    contract_sections,
    metric_names,
    unknown_metrics,
)
from tests.tools import require_tool

RULES_DIR = Path(__file__).resolve().parent.parent / "alerting-rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
RUNBOOKS = RULES_DIR / "runbooks"
RUNBOOK_PATTERN = (
    "https://github.com/mlx-medic/mlx-medic/blob/main/alerting-rules/runbooks/{}.md"
)
SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            alerts.extend(rule for rule in group["rules"] if "alert" in rule)
    return alerts


ALERTS = _alerts()
ALERT_IDS = [alert["alert"] for alert in ALERTS]


def _rule_tests() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_there_are_rule_files_and_unit_tests_to_check() -> None:
    assert RULE_FILES and UNIT_TESTS and len(ALERTS) >= 15


def test_promtool_accepts_every_rule_file() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, UNIT_TESTS)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_names_are_unique_and_camel_case() -> None:
    assert len(set(ALERT_IDS)) == len(ALERT_IDS)
    for name in ALERT_IDS:
        assert re.fullmatch(r"(?:[A-Z][A-Za-z0-9]*)+", name), name


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_alert_has_a_severity_a_static_summary_and_a_templated_description(
    alert: dict[str, Any],
) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    summary = annotations["summary"]
    assert summary.endswith(".") and "{{" not in summary, summary
    description = annotations["description"].strip()
    assert description
    # absent() has no labels to name and no meaningful value; every other alert says which.
    if not alert["expr"].lstrip().startswith("absent("):
        assert "{{ $labels." in description or "{{ $value" in description, description


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_runbook_url_follows_the_pattern_and_its_page_exists(
    alert: dict[str, Any],
) -> None:
    slug = alert["alert"].lower()
    assert alert["annotations"]["runbook_url"] == RUNBOOK_PATTERN.format(slug)
    page = RUNBOOKS / f"{slug}.md"
    assert page.is_file(), f"missing runbook {page}"
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# {alert['alert']}\n")
    assert "mlx-medic resume" in text or "Nothing is paused" in text or "Nothing to resume" in text


def test_every_runbook_page_belongs_to_an_alert() -> None:
    pages = {page.stem for page in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == {name.lower() for name in ALERT_IDS}


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_metric_in_the_rules_is_in_the_metric_contract(alert: dict[str, Any]) -> None:
    names = metric_names(alert["expr"])
    assert names, f"no metric found in {alert['expr']!r}"
    assert not unknown_metrics(names), f"{alert['alert']} uses {unknown_metrics(names)}"


def test_every_alert_is_unit_tested_both_firing_and_quiet() -> None:
    cases = _rule_tests()
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert set(ALERT_IDS) - firing == set(), "alerts never tested firing"
    assert set(ALERT_IDS) - quiet == set(), "alerts never tested quiet"


def test_every_expected_alert_in_the_unit_tests_checks_its_annotations() -> None:
    for case in _rule_tests():
        for expected in case.get("exp_alerts") or []:
            assert {"summary", "description", "runbook_url"} <= set(expected["exp_annotations"])
            assert "severity" in expected["exp_labels"]


def test_the_alert_the_remediator_routes_on_exists_and_keeps_its_model_label() -> None:
    routing = RoutingConfig()
    by_name = {alert["alert"]: alert for alert in ALERTS}
    for alertname in routing.playbooks:
        assert alertname in by_name, f"the remediator routes on {alertname}, no rule fires it"
    assert by_name["LLMModelDown"]["labels"]["severity"] == "critical"
    # The orphan alert carries the node whose orphans sweep-orphans removes.
    assert routing.playbooks["MLXOrphanProcesses"] == "sweep-orphans"
    assert "node" in by_name["MLXOrphanProcesses"]["expr"]
    model_down_tests = [
        expected["exp_labels"]
        for case in _rule_tests() if case["alertname"] in routing.playbooks
        for expected in case.get("exp_alerts") or []
    ]
    assert model_down_tests
    assert all(routing.model_label in labels for labels in model_down_tests)


def _reads_exporter_series(alert: dict[str, Any]) -> bool:
    """Exporter names: those under the contract's exporter heading."""
    exporter = set(contract_sections()["exporter"])
    return bool(metric_names(alert["expr"]) & exporter)


EXPORTER_ALERTS = [a for a in ALERTS if _reads_exporter_series(a)]


@pytest.mark.parametrize("alert", EXPORTER_ALERTS, ids=[a["alert"] for a in EXPORTER_ALERTS])
def test_alerts_on_exporter_series_keep_the_node_and_name_it(alert: dict[str, Any]) -> None:
    """Every exporter series carries `node` (the inventory's name): aggregations keep it and
    the description names it, never the scrape address."""
    expr = alert["expr"]
    for grouped in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        assert "node" in {label.strip() for label in grouped.split(",")}, expr
    assert "without" not in expr and "instance" not in expr, expr
    description = alert["annotations"]["description"]
    assert "$labels.instance" not in description
    if not expr.lstrip().startswith("absent("):
        assert "{{ $labels.node }}" in description, description


def test_the_metric_scanner_reads_names_and_skips_functions_labels_and_durations() -> None:
    expr = (
        'sum by (node, model) (increase(mlx_log_errors_total{signature="x"}[10m])) > 0 '
        "or up offset 1h unless on (job) mlx_model_up == 0"
    )
    assert metric_names(expr) == {"mlx_log_errors_total", "up", "mlx_model_up"}
    assert unknown_metrics({"mlx_medic_remediation_duration_seconds_bucket", "up"}) == set()
    assert unknown_metrics({"mlx_made_up_total"}) == {"mlx_made_up_total"}
