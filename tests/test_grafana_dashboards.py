"""The Grafana dashboards: generated, committed as generated, valid PromQL over the metric
contract, one data source variable, and provisioning files Grafana can load."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.promql_names import metric_names, unknown_metrics
from tests.tools import require_tool

GRAFANA = Path(__file__).resolve().parent.parent / "grafana"
COMMITTED = sorted((GRAFANA / "dashboards").glob("*.json"))
PROVISIONING = GRAFANA / "provisioning"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(board) for t in p.get("targets", [])]


def test_the_committed_json_is_exactly_what_the_generator_produces() -> None:
    generated = GENERATE.dashboards()
    assert {path.name for path in COMMITTED} == set(generated)
    for path in COMMITTED:
        assert path.read_text(encoding="utf-8") == GENERATE.render(generated[path.name]), (
            f"{path.name} is out of date: run python grafana/generate.py"
        )
    assert GENERATE.main(["--check"]) == 0


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_dashboard_is_valid_json_with_a_title_and_panels(path: Path) -> None:
    board = _load(path)
    assert board["title"] and board["panels"]
    assert re.fullmatch(r"[a-z0-9-]{1,40}", board["uid"])


def test_every_dashboard_has_a_unique_uid_and_title() -> None:
    boards = [_load(path) for path in COMMITTED]
    assert len({b["uid"] for b in boards}) == len(boards)
    assert len({b["title"] for b in boards}) == len(boards)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_query_goes_through_the_datasource_variable(path: Path) -> None:
    board = _load(path)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        assert all(t["datasource"] == expected for t in panel["targets"]), panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == expected


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_variable_used_in_a_query_is_defined(path: Path) -> None:
    board = _load(path)
    defined = {v["name"] for v in board["templating"]["list"]}
    queries = _exprs(board) + [
        v["query"] for v in board["templating"]["list"] if v["type"] == "query"
    ]
    for query in queries:
        for name in re.findall(r"\$\{?(\w+)", query):
            assert name.startswith("__") or name in defined, f"${name} in {query}"


def test_the_cluster_overview_filters_by_node_and_model() -> None:
    board = _load(GRAFANA / "dashboards" / "mlx-medic-cluster.json")
    assert {"node", "model"} <= {v["name"] for v in board["templating"]["list"]}


def test_the_cluster_overview_filters_exporter_series_by_node_never_by_address() -> None:
    """Every exporter series carries `node` (the inventory's name); only Prometheus's `up`,
    which has none, is shown by scrape target."""
    board = _load(GRAFANA / "dashboards" / "mlx-medic-cluster.json")
    for expr in _exprs(board):
        if metric_names(expr) == {"up"}:
            continue
        assert 'node=~"$node"' in expr and "instance" not in expr, expr


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_panel_reads_only_metric_contract_names(path: Path) -> None:
    board = _load(path)
    for expr in _exprs(board):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert not unknown_metrics(names), f"{unknown_metrics(names)} in {expr!r}"
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", variable["query"])
        assert selector, variable["query"]
        if selector.group(1):
            assert not unknown_metrics(metric_names(selector.group(1))), variable["query"]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_panels_have_unique_ids_and_fit_the_grid(path: Path) -> None:
    panels = _panels(_load(path))
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule, with Grafana's variables filled in."""
    promtool = require_tool("promtool")
    fill = {"$__rate_interval": "5m", "$__range": "6h", "$__interval": "1m"}
    rules = []
    for index, expr in enumerate(e for path in COMMITTED for e in _exprs(_load(path))):
        for variable, value in fill.items():
            expr = expr.replace(variable, value)
        expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    rule_file = tmp_path / "dashboard-queries.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_provider_loads_files_from_a_path() -> None:
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "mlx-medic.yaml").read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"]


def test_the_example_datasource_is_a_prometheus_with_a_stable_uid() -> None:
    config = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus" and source["uid"] and source["url"]
    assert not re.search(r"\d+\.\d+\.\d+\.\d+", source["url"]), "examples use hostnames"


def _board(name: str) -> dict[str, Any]:
    return _load(GRAFANA / "dashboards" / name)


# Grafana's unit ids for a count per time: per second and per minute.
PER_TIME_UNITS = {"ops", "opm", "cps", "cpm", "reqps", "reqpm"}


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_panel_has_a_description(path: Path) -> None:
    for panel in _panels(_load(path)):
        if panel["type"] != "row":
            assert len(panel["description"].strip()) > 20, panel["title"]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_rate_or_increase_panel_has_a_unit_that_says_per_what(path: Path) -> None:
    """A rate is shown per second or minute; a duration from histogram rates in seconds;
    an increase over the time range as a plain count, its title saying `in range`."""
    for panel in _panels(_load(path)):
        exprs = [t["expr"] for t in panel.get("targets", [])]
        if not any(re.search(r"\b(rate|increase)\(", e) for e in exprs):
            continue
        unit, title = panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        if "duration" in title.lower():
            assert unit == "s", title
        elif all("[$__range]" in e for e in exprs):
            assert unit == "short" and "in range" in title, title
        else:
            assert unit in PER_TIME_UNITS and "per minute" in title, (title, unit)


def _is_red(override: dict[str, Any]) -> bool:
    for prop in override["properties"]:
        if prop["id"] == "color" and prop["value"] == {"mode": "fixed", "fixedColor": "red"}:
            return True
        if prop["id"] == "thresholds" and prop["value"]["steps"][-1]["color"] == "red":
            return True
    return False


def test_failed_outcomes_are_red_on_every_outcome_panel() -> None:
    """The runs that need a person stand out; the others keep the panel's colours."""
    from mlx_medic.remediator.outcomes import RunOutcome

    failed = {"failed", "escalated", "misconfigured", "unreachable"}
    assert failed <= {o.value for o in RunOutcome}
    outcome_panels = [
        p
        for p in _panels(_board("mlx-medic-remediator.json"))
        if any("{{outcome}}" in t["legendFormat"] for t in p.get("targets", []))
    ]
    assert len(outcome_panels) == 2
    for panel in outcome_panels:
        overrides = panel["fieldConfig"]["overrides"]
        assert overrides and all(_is_red(o) for o in overrides), panel["title"]
        patterns = [o["matcher"]["options"] for o in overrides if o["matcher"]["id"] == "byRegexp"]
        for outcome in RunOutcome:
            for legend in (outcome.value, f"some-model {outcome.value}"):
                red = any(re.search(pattern, legend) for pattern in patterns)
                assert red == (outcome.value in failed), (panel["title"], legend)


def test_the_remediator_shows_remediation_duration_per_model() -> None:
    (panel,) = [
        p
        for p in _panels(_board("mlx-medic-remediator.json"))
        if p["title"].startswith("Remediation duration per model")
    ]
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(
        "histogram_quantile" in e and "by (model, le)" in e and 'model=~"$model"' in e
        for e in exprs
    )
    assert all("{{model}}" in t["legendFormat"] for t in panel["targets"])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_dashboard_links_to_the_runbooks_and_the_on_call_page(path: Path) -> None:
    """The runbooks under the base URL the alerting rules link to; the on-call page at the
    `oncall_url` variable, by default the remediator's listen address."""
    board = _load(path)
    links = {link["title"]: link for link in board["links"]}
    rules = (GRAFANA.parent / "alerting-rules" / "mlx-medic.rules.yaml").read_text()
    runbook_url = re.search(r"runbook_url: (\S+/)\w+\.md", rules)
    assert runbook_url
    assert links["Runbooks"]["url"] == runbook_url.group(1) + "README.md"
    assert (GRAFANA.parent / "alerting-rules" / "runbooks" / "README.md").is_file()
    assert links["On-call page"]["url"] == "${oncall_url}"
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "oncall_url"]
    assert variable["type"] == "textbox"
    listen = yaml.safe_load((GRAFANA.parent / "deploy" / "remediator.yml").read_text())["listen"]
    assert variable["query"] == variable["current"]["value"] == f"http://{listen}/"
