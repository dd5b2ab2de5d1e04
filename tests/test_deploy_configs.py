"""The example Prometheus and Alertmanager configs (rendered from examples/inventory.yaml):
accepted by promtool and amtool, load the project's rules, scrape both deployables, and
route LLMModelDown and the orphan alert to the remediator."""

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
RULES_GLOB = "rules/*.yaml"
SHIPPED_RULES = DEPLOY.parent / "alerting-rules" / "mlx-medic.rules.yaml"
IP_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=False)


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_promtool_accepts_the_prometheus_config_and_its_rule_files(tmp_path: Path) -> None:
    """promtool insists that credentials files exist: check a copy, in a tmp dir, whose token
    path points at a real file. Relative rule paths resolve against the config's own dir, so
    the copy names deploy/'s rules by absolute path."""
    text = PROMETHEUS.read_text(encoding="utf-8")
    assert text.count(TOKEN_FILE) == 1 and text.count(RULES_GLOB) == 1
    token = tmp_path / "mlx-medic.token"
    token.write_text("not-a-secret\n")
    rules = DEPLOY / "rules"
    copy = tmp_path / "prometheus.yml"
    copy.write_text(text.replace(TOKEN_FILE, str(token)).replace(RULES_GLOB, f"{rules}/*.yaml"))
    result = _run(require_tool("promtool"), "check", "config", str(copy))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 rule files found" in output and "mlx-medic.rules.yaml" in output, output


def test_the_rule_path_in_the_prometheus_config_is_the_shipped_rules_rendered_beside_it() -> None:
    assert _load(PROMETHEUS)["rule_files"] == [RULES_GLOB]
    assert [p.name for p in DEPLOY.glob(RULES_GLOB)] == ["mlx-medic.rules.yaml"]
    assert (DEPLOY / "rules" / "mlx-medic.rules.yaml").read_text() == SHIPPED_RULES.read_text()


def test_amtool_accepts_the_alertmanager_config() -> None:
    result = _run(require_tool("amtool"), "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=LLMModelDown", "model=glm-4_6-5b", "severity=critical"], "mlx-medic,oncall"),
        (
            ["alertname=MLXOrphanProcesses", "model=glm-4_6-5b", "node=ai002", "severity=warning"],
            "mlx-medic,oncall",
        ),
        (
            [
                "alertname=MLXOrphanProcessesUninterruptible",
                "model=glm-4_6-5b",
                "node=ai002",
                "severity=critical",
            ],
            "oncall",
        ),
        (["alertname=MLXMedicRemediationEscalated", "severity=critical"], "oncall"),
    ],
)
def test_model_down_and_orphans_reach_the_remediator_and_on_call_and_other_alerts_only_on_call(
    labels: list[str],
    receivers: str,
) -> None:
    result = _run(
        require_tool("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER}",
        f"--verify.receivers={receivers}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_remediator_routes_carry_every_alert_it_has_a_playbook_for_by_model() -> None:
    routes = [r for r in _load(ALERTMANAGER)["route"]["routes"] if r["receiver"] == "mlx-medic"]
    routed = {}
    for route in routes:
        (matcher,) = route["matchers"]
        name = re.fullmatch(r'alertname="(\w+)"', matcher)
        assert name is not None, matcher
        routed[name[1]] = route
        assert RoutingConfig().model_label in route["group_by"]
    # MLXUnkillableSurvivors (reboot-node, per node) is routed only where a node opts in to
    # the guarded reboot: tests/render (reboot.allowed)
    assert set(RoutingConfig().playbooks) - {"MLXUnkillableSurvivors"} <= set(routed)
    assert set(routed) == {"LLMModelDown", "MLXOrphanProcesses"}
    assert "node" in routed["MLXOrphanProcesses"]["group_by"]  # a sweep is per node


def test_no_inhibition_mutes_an_alert_the_remediator_acts_on() -> None:
    """Alertmanager mutes an inhibited alert for every receiver, the webhook too: a stuck
    orphan on a node must not hide the fresh orphans there that a sweep can remove."""
    config = _load(ALERTMANAGER)
    routed = {r["matchers"][0] for r in config["route"]["routes"] if r["receiver"] == "mlx-medic"}
    for rule in config.get("inhibit_rules", []):
        assert not routed & set(rule["target_matchers"]), rule


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


def test_the_alertmanager_example_names_hosts_never_ip_addresses() -> None:
    assert not IP_ADDRESS.search(ALERTMANAGER.read_text(encoding="utf-8"))


def test_prometheus_scrapes_each_exporter_at_its_inventory_address() -> None:
    from mlx_medic.inventory.load import load_inventory

    inventory = load_inventory(DEPLOY.parent / "examples" / "inventory.yaml")
    (job,) = [
        j for j in _load(PROMETHEUS)["scrape_configs"] if j["job_name"] == "mlx-medic-exporter"
    ]
    assert job["static_configs"][0]["targets"] == [f"{n.ssh}:10900" for n in inventory.nodes]


def test_the_example_remediator_config_loads_with_the_documented_values() -> None:
    config = load_config(DEPLOY / "remediator.yml")
    assert config.auth.configured and config.auth.basic_username == "oncall"
    assert config.routing.playbooks == {
        "LLMModelDown": "recover",
        "MLXOrphanProcesses": "sweep-orphans",
    }
    assert config.max_alert_age == 6 * 3600
    assert not config.dry_run and config.tls is None


def test_the_example_read_only_credentials_load_once_uncommented(tmp_path: Path) -> None:
    text = (DEPLOY / "remediator.yml").read_text(encoding="utf-8")
    for line in ("read_only:", "basic_username: viewer", "basic_password_file: /etc"):
        text = text.replace(f"  # {line}", f"  {line}").replace(f"  #   {line}", f"    {line}")
    (tmp_path / "remediator.yml").write_text(text)
    read_only = load_config(tmp_path / "remediator.yml").auth.read_only
    assert read_only is not None and read_only.basic_username == "viewer"


def test_the_launchd_plist_runs_a_command_the_cli_accepts() -> None:
    import plistlib

    from mlx_medic.cli import parse_args

    with (DEPLOY / "launchd" / "ai001" / "com.mlx-medic.exporter.plist").open("rb") as handle:
        plist = plistlib.load(handle)
    assert plist["Label"] == "com.mlx-medic.exporter"
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    args = parse_args(plist["ProgramArguments"][1:])
    assert args.command == "exporter" and args.listen == "192.168.101.1:10900"
    assert args.node == "ai001" and args.inventory == Path("/etc/mlx-medic/inventory.yaml")
    assert args.log_file == Path("/var/log/mlx-medic-exporter.log")


@pytest.mark.parametrize(
    "unit", ["mlx-medic-remediator.service", "ai001/mlx-medic-exporter.service"]
)
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
