"""The example Prometheus and Alertmanager configs: accepted by promtool and amtool, load the
project's rules, scrape both deployables, and route LLMModelDown to the remediator."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.config import RoutingConfig, load_config
from tests.tools import require_tool

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PROMETHEUS = DEPLOY / "prometheus.yml"
ALERTMANAGER = DEPLOY / "alertmanager.yml"
TOKEN_FILE = "/etc/prometheus/mlx-medic.token"
RULES_GLOB = "../alerting-rules/*.yaml"
IP_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=False)


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_promtool_accepts_the_prometheus_config_and_its_rule_files(tmp_path: Path) -> None:
    """promtool insists that credentials files exist: check a copy, in a tmp dir, whose token
    path points at a real file. Relative rule paths resolve against the config's own dir, so
    the copy names the repo's rules by absolute path (from deploy/ they are ../alerting-rules)."""
    text = PROMETHEUS.read_text(encoding="utf-8")
    assert text.count(TOKEN_FILE) == 1 and text.count(RULES_GLOB) == 1
    token = tmp_path / "mlx-medic.token"
    token.write_text("not-a-secret\n")
    rules = (DEPLOY / RULES_GLOB).resolve().parent
    copy = tmp_path / "prometheus.yml"
    copy.write_text(text.replace(TOKEN_FILE, str(token)).replace(RULES_GLOB, f"{rules}/*.yaml"))
    result = _run(require_tool("promtool"), "check", "config", str(copy))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 rule files found" in output and "mlx-medic.rules.yaml" in output, output


def test_the_rule_path_in_the_prometheus_config_is_the_repos_rules_seen_from_deploy() -> None:
    assert _load(PROMETHEUS)["rule_files"] == [RULES_GLOB]
    assert [p.name for p in DEPLOY.glob(RULES_GLOB)] == ["mlx-medic.rules.yaml"]


def test_amtool_accepts_the_alertmanager_config() -> None:
    result = _run(require_tool("amtool"), "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=LLMModelDown", "model=glm-4_6-5b", "severity=critical"], "mlx-medic,oncall"),
        (["alertname=MLXOrphanProcesses", "model=glm-4_6-5b", "severity=warning"], "oncall"),
        (["alertname=MLXMedicRemediationEscalated", "severity=critical"], "oncall"),
    ],
)
def test_llm_model_down_reaches_the_remediator_and_on_call_and_other_alerts_only_on_call(
    labels: list[str], receivers: str,
) -> None:
    result = _run(
        require_tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}",
        f"--verify.receivers={receivers}", *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_remediator_route_matches_the_alert_the_remediator_acts_on() -> None:
    route = next(r for r in _load(ALERTMANAGER)["route"]["routes"] if r["receiver"] == "mlx-medic")
    (matcher,) = route["matchers"]
    routed = re.fullmatch(r'alertname="(\w+)"', matcher)
    assert routed is not None, matcher
    assert set(RoutingConfig().playbooks) == {routed[1]}
    assert RoutingConfig().model_label in route["group_by"]


def test_the_webhook_sends_resolved_alerts_with_a_credentials_file() -> None:
    receiver = next(r for r in _load(ALERTMANAGER)["receivers"] if r["name"] == "mlx-medic")
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True
    assert webhook["url"].endswith(":10901/alerts")
    assert webhook["http_config"]["authorization"]["credentials_file"]
    assert "credentials" not in webhook["http_config"]["authorization"]


def test_prometheus_scrapes_exporters_on_10900_and_the_remediator_on_10901() -> None:
    jobs = {job["job_name"]: job for job in _load(PROMETHEUS)["scrape_configs"]}
    exporters = [t for c in jobs["mlx-medic-exporter"]["static_configs"] for t in c["targets"]]
    remediators = [t for c in jobs["mlx-medic-remediator"]["static_configs"] for t in c["targets"]]
    assert exporters and all(t.endswith(":10900") for t in exporters)
    assert remediators and all(t.endswith(":10901") for t in remediators)
    # The remediator's /metrics sits behind the webhook's credentials (only /healthz is open).
    assert jobs["mlx-medic-remediator"]["authorization"]["credentials_file"] == TOKEN_FILE


@pytest.mark.parametrize("path", [PROMETHEUS, ALERTMANAGER], ids=lambda p: p.name)
def test_the_examples_name_hosts_never_ip_addresses(path: Path) -> None:
    assert not IP_ADDRESS.search(path.read_text(encoding="utf-8"))


def test_the_example_remediator_config_loads_with_the_documented_values() -> None:
    config = load_config(DEPLOY / "remediator.yml")
    assert config.auth.configured and config.auth.basic_username == "oncall"
    assert config.routing.playbooks == {"LLMModelDown": "recover"}
    assert config.max_alert_age == 6 * 3600
    assert not config.dry_run and config.tls is None


def test_the_launchd_plist_runs_a_command_the_cli_accepts() -> None:
    import plistlib

    from mlx_medic.cli import parse_args

    with (DEPLOY / "launchd" / "com.mlx-medic.exporter.plist").open("rb") as handle:
        plist = plistlib.load(handle)
    assert plist["Label"] == "com.mlx-medic.exporter"
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    args = parse_args(plist["ProgramArguments"][1:])
    assert args.command == "exporter" and args.listen == "0.0.0.0:10900"


@pytest.mark.parametrize("unit", ["mlx-medic-remediator.service", "mlx-medic-exporter.service"])
def test_the_systemd_units_run_commands_the_cli_accepts(unit: str) -> None:
    import configparser
    import shlex

    from mlx_medic.cli import parse_args

    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / "systemd" / unit)
    argv = shlex.split(parser["Service"]["ExecStart"])
    assert argv[0].endswith("/mlx-medic")
    parse_args(argv[1:])
