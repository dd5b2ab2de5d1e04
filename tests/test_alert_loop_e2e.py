"""The alerting loop closes with real parts only: the exporter probes a real `mlx_lm.server`,
Debian's Prometheus scrapes it and evaluates the repo's rules, Debian's Alertmanager
delivers LLMModelDown to the remediator's webhook, and the remediator (dry run, model lock
on the testbed's head node over SSH) journals a run that `mlx-medic log` shows.

Only the rules' `for:` of LLMModelDown is shortened (2m would make the test minutes long);
every expression and label is the repo's. Prometheus's config is deploy/prometheus.yml
with local targets and 1 s intervals."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.exporter.main import REGISTRY  # every collector registered
from testbed.processes import stop_child
from tests.exporter.real_mlx_server import RealServer, mlx_lm_server
from tests.remediator.conftest import (
    REPO,
    Alertmanager,
    Service,
    Stack,
    alertmanager_config,
    free_port,
    http,
    mlx_medic,
    runs_of,
    services,
    stack,
    start_alertmanager,
    subprocess_env,
    wait_for_port,
    wait_until,
)
from tests.tools import require_tool

__all__ = ["services", "stack"]  # fixtures this module uses from the remediator's conftest

RULES = REPO / "alerting-rules" / "mlx-medic.rules.yaml"
DEPLOYED_PROMETHEUS = REPO / "deploy" / "prometheus.yml"
ALERT = "LLMModelDown"
SHORT_FOR = "2s"
WAIT = 90.0  # each step takes seconds; the machine is shared


@dataclass
class Daemon:
    """A process this test started, with its log file; stopped by its pid only."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def stop(self) -> None:
        stop_child(self.proc)


def start_daemon(
    name: str, argv: list[str], workdir: Path, port: int, env: dict[str, str] | None = None
) -> Daemon:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(name, proc, port, log_path)
    try:
        wait_for_port(port, proc, timeout=60)
    except Exception as exc:
        daemon.stop()
        raise RuntimeError(
            f"{name} did not listen on {port} ({exc}):\n"
            + log_path.read_text(errors="replace")[-3000:]
        ) from None
    return daemon


@dataclass
class Loop:
    """Every part of the loop, and what a failed wait should show of each."""

    server: RealServer
    stack: Stack
    remediator: Service
    alertmanager: Alertmanager
    exporter: Daemon
    prometheus: Daemon

    def logs(self) -> str:
        named = [
            ("mlx_lm.server", self.server.log_path),
            ("exporter", self.exporter.log_path),
            ("prometheus", self.prometheus.log_path),
            ("alertmanager", self.alertmanager.workdir / "alertmanager.log"),
            ("remediator", self.remediator.stderr_path),
        ]
        parts = []
        for name, path in named:
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {name} ({path}), last lines:\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], Any], what: str) -> Any:
        try:
            return wait_until(predicate, timeout=WAIT, interval=0.5, what=what)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def prometheus_api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.prometheus.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, body = http("GET", url)
        assert status == 200 and body["status"] == "success", (url, status, body)
        return body["data"]

    def model_up(self) -> list[str]:
        """Prometheus's latest mlx_model_up{model="m1"} value(s), as strings."""
        result = self.prometheus_api("query", query='mlx_model_up{model="m1"}')["result"]
        return [sample["value"][1] for sample in result]

    def scrape_health(self) -> dict[str, str]:
        return {
            target["labels"]["job"]: target["health"]
            for target in self.prometheus_api("targets")["activeTargets"]
        }

    def rule(self) -> dict[str, Any]:
        groups = self.prometheus_api("rules", type="alert")["groups"]
        return next(rule for group in groups for rule in group["rules"] if rule["name"] == ALERT)

    def alertmanager_fingerprints(self) -> list[str]:
        status, alerts = http(
            "GET",
            f"{self.alertmanager.url}/api/v2/alerts?"
            + urllib.parse.urlencode({"filter": f'alertname="{ALERT}"'}),
        )
        assert status == 200, (status, alerts)
        return [alert["fingerprint"] for alert in alerts if alert["labels"].get("model") == "m1"]

    def firing(self) -> list[dict[str, Any]]:
        return [
            alert
            for alert in self.prometheus_api("alerts")["alerts"]
            if alert["labels"]["alertname"] == ALERT and alert["state"] == "firing"
        ]


def rules_with_short_for(workdir: Path) -> Path:
    """The repo's rules with only LLMModelDown's `for:` shortened."""
    groups = yaml.safe_load(RULES.read_text())
    rules = [
        rule for group in groups["groups"] for rule in group["rules"] if rule.get("alert") == ALERT
    ]
    assert len(rules) == 1, f"{RULES} should define {ALERT} once"
    rules[0]["for"] = SHORT_FOR
    path = workdir / "mlx-medic.rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def prometheus_config(
    rules: Path,
    alertmanager: Alertmanager,
    exporter_port: int,
    remediator: Service,
    token_file: Path,
) -> dict[str, Any]:
    """deploy/prometheus.yml, its jobs and relabelling kept, pointed at this test's parts."""
    config = yaml.safe_load(DEPLOYED_PROMETHEUS.read_text())
    config["global"] = {
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
        "scrape_timeout": "1s",
    }
    config["rule_files"] = [str(rules)]
    config["alerting"] = {
        "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]
    }
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"mlx-medic-exporter", "mlx-medic-remediator"}, set(jobs)
    jobs["mlx-medic-exporter"]["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    remediator_job = jobs["mlx-medic-remediator"]
    remediator_job["scheme"] = "http"  # the test's remediator listens without TLS
    remediator_job["authorization"]["credentials_file"] = str(token_file)
    remediator_job["static_configs"] = [{"targets": [f"127.0.0.1:{remediator.port}"]}]
    return config


@pytest.fixture
def model_server(tiny_model: Path, tmp_path: Path) -> Iterator[RealServer]:
    with mlx_lm_server(tiny_model, tmp_path / "mlx_lm_server.log") as server:
        yield server


@pytest.fixture
def daemons() -> Iterator[list[Daemon | Alertmanager]]:
    """Started exporter, Prometheus and Alertmanager; stopped by pid, newest first."""
    started: list[Daemon | Alertmanager] = []
    yield started
    for daemon in reversed(started):
        with contextlib.suppress(Exception):
            daemon.stop()


@pytest.fixture
def loop(
    stack: Stack, model_server: RealServer, tmp_path: Path, daemons: list[Daemon | Alertmanager]
) -> Loop:
    prometheus_binary = require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    require_tool("sshd")

    # One inventory for both sides, with one model: m1, whose head is the testbed's head
    # node ai001 (the remediator takes its lock there over SSH) and whose port is where the
    # real server listens.
    inventory = yaml.safe_load(stack.inventory.read_text())
    inventory["models"] = {"m1": {**inventory["models"]["m1"], "port": model_server.port}}
    stack.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))

    remediator = stack.start("--dry-run")
    alertmanager = start_alertmanager(
        tmp_path / "alertmanager", alertmanager_config(remediator.url + "/alerts", stack.token_file)
    )
    daemons.append(alertmanager)

    exporter_dir = tmp_path / "exporter"
    (exporter_dir / "state").mkdir(parents=True)
    exporter_port = free_port()
    only_service = [f"--no-collector.{name}" for name in sorted(REGISTRY) if name != "service"]
    exporter = start_daemon(
        "exporter",
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--inventory",
            str(stack.inventory),
            "--node",
            "ai001",
            "--state-dir",
            str(exporter_dir / "state"),
            "--web.listen-address",
            f"127.0.0.1:{exporter_port}",
            *only_service,
        ],
        exporter_dir,
        exporter_port,
        env=subprocess_env(MLX_MEDIC_SERVICE_INTERVAL="0.5"),
    )
    daemons.append(exporter)

    prometheus_dir = tmp_path / "prometheus"
    prometheus_dir.mkdir()
    config_file = prometheus_dir / "prometheus.yml"
    config_file.write_text(
        yaml.safe_dump(
            prometheus_config(
                rules_with_short_for(prometheus_dir),
                alertmanager,
                exporter_port,
                remediator,
                stack.token_file,
            )
        )
    )
    prometheus_port = free_port()
    prometheus = start_daemon(
        "prometheus",
        [
            prometheus_binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={prometheus_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        prometheus_dir,
        prometheus_port,
    )
    daemons.append(prometheus)
    # Prometheus listens before its storage is open and answers 503 until then.
    wait_until(
        lambda: http("GET", f"http://127.0.0.1:{prometheus_port}/-/ready")[0] == 200,
        timeout=60,
        interval=0.2,
        what="Prometheus to be ready",
    )
    return Loop(model_server, stack, remediator, alertmanager, exporter, prometheus)


def test_the_shortened_rules_keep_every_expression_and_label_of_the_repo(
    tmp_path: Path,
) -> None:
    repo = yaml.safe_load(RULES.read_text())
    copied = yaml.safe_load(rules_with_short_for(tmp_path).read_text())
    repo_rules = [rule for group in repo["groups"] for rule in group["rules"]]
    copied_rules = [rule for group in copied["groups"] for rule in group["rules"]]
    down = next(rule for rule in copied_rules if rule.get("alert") == ALERT)
    assert down["for"] == SHORT_FOR
    assert down["expr"] == next(r for r in repo_rules if r.get("alert") == ALERT)["expr"]
    down["for"] = next(r for r in repo_rules if r.get("alert") == ALERT)["for"]
    assert copied == repo


@pytest.mark.slow
def test_a_model_that_stops_answering_is_remediated_through_prometheus_and_alertmanager(
    loop: Loop,
) -> None:
    # Phase 1: the server answers, Prometheus sees it up, nothing fires, nothing runs.
    loop.wait(lambda: loop.model_up() == ["1"], 'Prometheus to scrape mlx_model_up{model="m1"} 1')
    loop.wait(
        lambda: loop.scrape_health() == {"mlx-medic-exporter": "up", "mlx-medic-remediator": "up"},
        "Prometheus to scrape the exporter and the remediator (bearer from a file)",
    )
    up_seen = loop.rule()["lastEvaluation"]
    rule = loop.wait(
        lambda: (r := loop.rule())["lastEvaluation"] != up_seen and r,
        f"Prometheus to evaluate {ALERT} with the model up",
    )
    assert rule["health"] == "ok", rule
    assert rule["state"] == "inactive" and not rule["alerts"], rule
    assert loop.model_up() == ["1"] and not loop.firing()
    assert runs_of(loop.stack, "m1") == []

    # Phase 2: the server's process ends; the loop must bring a run for m1.
    loop.server.stop()
    loop.wait(lambda: loop.model_up() == ["0"], 'Prometheus to scrape mlx_model_up{model="m1"} 0')
    alert = loop.wait(loop.firing, f"Prometheus to fire {ALERT}")[0]
    assert alert["labels"]["model"] == "m1" and alert["labels"]["severity"] == "critical"
    run = loop.wait(
        lambda: [r for r in runs_of(loop.stack, "m1") if r["outcome"] not in ("queued", "running")],
        "Alertmanager to deliver the firing and the remediator to journal a finished run",
    )[0]
    assert run["alertname"] == ALERT and run["trigger_kind"] != "manual"
    assert run["fingerprint"] in loop.alertmanager_fingerprints()  # Alertmanager's alert
    assert run["dry_run"] and run["outcome"] == "planned", run
    assert run["steps"] and all(step["outcome"] == "planned" for step in run["steps"]), run
    assert len(runs_of(loop.stack, "m1")) == 1
    assert run["labels"]["job"] == "mlx-medic-exporter"  # Prometheus's labels, kept
    assert run["labels"]["severity"] == "critical"

    logged = json.loads(
        mlx_medic(
            "log", "--model", "m1", "--json", "--config.file", str(loop.remediator.config_file)
        ).stdout
    )
    assert [entry["id"] for entry in logged["runs"]] == [run["id"]]
    assert logged["runs"][0]["alertname"] == ALERT and logged["runs"][0]["dry_run"]
