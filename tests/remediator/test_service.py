"""The real `mlx-medic remediator` process, over HTTP, with the real engine, journal and
model lock on the simulated cluster's head node."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.remediator.conftest import (
    TOKEN,
    Service,
    Stack,
    basic,
    bearer,
    events_of,
    http,
    make_alert,
    make_payload,
    mlx_medic,
    post_alerts,
    runs_of,
    silent_inventory,
    start_service,
    wait_until,
    write_config,
)
from tests.remediator.engine_fakes import inventory_text
from tests.tools import require_tool


def test_a_firing_alert_starts_one_dry_run_that_plans_and_journals_every_step(
    stack: Stack,
) -> None:
    service = stack.start("--dry-run")
    status, body = post_alerts(service, make_payload(make_alert("m1", fingerprint="f1")))
    assert status == 202
    assert body["alerts"][0]["disposition"] == "started"
    run = wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["outcome"] == "planned"], what="a planned run"
    )[0]
    assert run["dry_run"] and run["fingerprint"] == "f1"
    assert [s["outcome"] for s in run["steps"]] == ["planned"] * len(run["steps"])
    assert {s["duration_seconds"] for s in run["steps"]} == {None}  # none of them ran
    assert run["recheck"].startswith("act: m1 is still down")
    assert "lock: not taken (dry run)" in run["detail"]
    assert not stack.lock_file("m1").exists()
    status, api = http(
        "GET", service.url + "/api/remediations?model=m1&since=1h&limit=5", headers=bearer()
    )
    assert status == 200 and [r["id"] for r in api["runs"]] == [run["id"]]
    assert api["runs"][0]["steps"] == run["steps"]
    assert http("GET", service.url + "/api/remediations?model=m2", headers=bearer())[1] == {
        "journal_problem": None,
        "runs": [],
        "decisions": [],
        "pauses": [],
        "circuits": [],
    }


def test_the_service_refuses_to_start_without_credentials_unless_told_it_is_insecure(
    stack: Stack,
) -> None:
    config = stack.config("noauth.yml", auth={})
    refused = mlx_medic("remediator", "--config.file", str(config), check=False)
    assert refused.returncode == 2
    assert "no credentials configured" in refused.stderr
    assert "--insecure-no-auth" in refused.stderr
    service = stack.start("--insecure-no-auth", config=config)
    assert post_alerts(service, make_payload(make_alert("m1")), headers={})[0] == 202


def test_a_bad_inventory_stops_the_service_with_exit_2_naming_the_problem(
    stack: Stack,
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad-inventory.yaml"
    bad.write_text("nodes:\n  ai001: {ssh: '-oProxyCommand=x'}\n")
    config = stack.config("bad.yml", inventory=str(bad))
    result = mlx_medic("remediator", "--config.file", str(config), check=False)
    assert result.returncode == 2
    assert "bad-inventory.yaml" in result.stderr and "line 2" in result.stderr


def test_wrong_credentials_bad_payloads_and_oversized_bodies_are_refused_with_reasons(
    stack: Stack,
) -> None:
    service = stack.start("--dry-run")
    good = make_payload(make_alert("m1"))
    for headers, reason in [
        ({}, "no credentials"),
        (bearer("nope"), "wrong bearer token"),
        (basic(password="nope"), "wrong basic credentials"),
    ]:
        status, body = post_alerts(service, good, headers)
        assert (status, body["reason"]) == (401, reason)
    for payload, reason in [
        (b"{broken", "body is not valid JSON"),
        (make_payload(version="3"), 'unsupported payload version "3"'),
        (make_payload(alerts="none"), "alerts: Input should be a valid list"),
    ]:
        status, body = post_alerts(service, payload)
        assert status == 400 and reason in body["reason"]
    status, body = post_alerts(service, make_payload(make_alert(labels={"pad": "x" * 70_000})))
    assert (status, body["reason"]) == (413, "body larger than 65536 bytes")
    assert runs_of(stack, "m1") == []
    decisions = [line for line in service.log_lines() if line.get("msg") == "request"]
    assert [d["status"] for d in decisions] == [401, 401, 401, 400, 400, 400, 413]
    assert all(d.get("reason") for d in decisions)


def test_two_valid_firings_and_an_invalid_alert_in_one_delivery_give_two_runs_and_a_reason(
    stack: Stack,
) -> None:
    """Alertmanager does not retry a 4xx: refusing the whole delivery would lose both
    valid firings. The invalid alert is journaled with its reason instead."""
    service = stack.start("--dry-run")
    status, body = post_alerts(
        service,
        make_payload(
            make_alert("m1", fingerprint="ok-m1"),
            make_alert(None, fingerprint="no-model"),
            make_alert("m2", fingerprint="ok-m2"),
        ),
    )
    assert status == 202
    assert [(a["fingerprint"], a["disposition"]) for a in body["alerts"]] == [
        ("ok-m1", "started"),
        ("no-model", "invalid"),
        ("ok-m2", "started"),
    ]
    reason = (
        "alerts[1].labels.model: alert \"LLMModelDown\" needs the 'model' label naming the model"
    )
    assert body["alerts"][1]["reason"] == reason
    for model in ("m1", "m2"):
        wait_until(
            lambda model=model: [r for r in runs_of(stack, model) if r["outcome"] == "planned"],
            what=f"{model}'s run",
        )
    (event,) = events_of(stack, kind="invalid")
    assert event["fingerprint"] == "no-model"
    assert event["detail"] == f"alert 'LLMModelDown' is not acted on: {reason}"
    _, api = http("GET", service.url + "/api/remediations", headers=bearer())
    assert {r["model"] for r in api["runs"]} == {"m1", "m2"}
    assert [d["detail"] for d in api["decisions"] if d["kind"] == "invalid"] == [event["detail"]]
    _, page = http("GET", service.url + "/", headers=basic())
    assert "needs the &#x27;model&#x27; label naming the model" in page
    logged = mlx_medic("log", "--config.file", str(service.config_file)).stdout
    decisions = logged.split("RECENT DECISIONS", 1)[1]
    assert "invalid" in decisions and "no-model" in decisions
    assert "needs the 'model' label" in " ".join(decisions.split())


def test_an_unknown_model_is_journaled_and_ignored(stack: Stack) -> None:
    service = stack.start("--dry-run")
    status, body = post_alerts(service, make_payload(make_alert("no-such-model")))
    assert (status, body["alerts"][0]["disposition"]) == (202, "unknown_model")
    event = events_of(stack, kind="unknown_model")[0]
    assert "no-such-model" in event["detail"]
    journal_runs = stack.journal().list_runs(limit=100)
    assert journal_runs == []


async def _post_many(url: str, payloads: list[dict]) -> list[tuple[int, dict]]:
    connector = aiohttp.TCPConnector(limit=100)
    async with aiohttp.ClientSession(connector=connector, headers=bearer()) as session:

        async def one(payload: dict) -> tuple[int, dict]:
            async with session.post(url, json=payload) as response:
                return response.status, await response.json()

        return await asyncio.gather(*(one(p) for p in payloads))


def test_a_hundred_concurrent_deliveries_of_the_same_alert_give_exactly_one_run(
    stack: Stack,
) -> None:
    service = stack.start()
    payload = make_payload(make_alert("m1", alertname="SlowDown", fingerprint="same"))
    answers = asyncio.run(_post_many(service.url + "/alerts", [payload] * 100))
    dispositions = sorted(body["alerts"][0]["disposition"] for _, body in answers)
    assert {status for status, _ in answers} == {202}
    assert dispositions.count("started") == 1
    assert dispositions.count("duplicate") == 99
    assert len(runs_of(stack, "m1")) == 1


def test_a_hundred_new_fingerprints_for_a_model_with_a_run_in_progress_start_nothing_more(
    stack: Stack,
) -> None:
    service = stack.start()
    first = make_payload(make_alert("m1", alertname="SlowDown", fingerprint="first"))
    assert post_alerts(service, first)[1]["alerts"][0]["disposition"] == "started"
    wait_until(
        lambda: any(
            s["name"] == "hold" and s["outcome"] == "running"
            for r in runs_of(stack, "m1")
            for s in r["steps"]
        ),
        what="the slow run holding the model",
    )
    assert stack.lock_file("m1").exists()
    others = [
        make_payload(make_alert("m1", alertname="SlowDown", fingerprint=f"{i:016x}"))
        for i in range(100)
    ]
    answers = asyncio.run(_post_many(service.url + "/alerts", others))
    dispositions = {body["alerts"][0]["disposition"] for _, body in answers}
    assert dispositions == {"absorbed"}
    runs = runs_of(stack, "m1")
    assert len(runs) == 1 and runs[0]["outcome"] == "running"


def test_a_spent_budget_escalates_and_nothing_more_happens_until_resume(stack: Stack) -> None:
    """m1's budget is 2 runs an hour; its playbook 'recovers' it and it falls over again."""
    service = stack.start()
    start = datetime.now(UTC) - timedelta(minutes=10)

    def fire(n: int) -> str:
        alert = make_alert(
            "m1", alertname="FlapDown", fingerprint="flap", starts_at=start + timedelta(seconds=n)
        )
        status, body = post_alerts(service, make_payload(alert))
        assert status == 202
        return body["alerts"][0]["disposition"]

    for n in (1, 2):
        assert fire(n) == "started"
        wait_until(
            lambda n=n: len([r for r in runs_of(stack, "m1") if r["outcome"] == "succeeded"]) == n,
            what=f"run {n} to succeed",
        )
    assert fire(3) == "circuit_open"
    escalation = wait_until(
        lambda: [e for e in events_of(stack, model="m1") if "escalat" in e["kind"]],
        what="an escalation",
    )[0]
    assert "budget" in escalation["detail"] or "runs" in escalation["detail"]
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert 'mlx_medic_escalations_total{model="m1",reason="budget_spent"} 1.0' in metrics
    assert fire(4) == "circuit_open"
    assert len(runs_of(stack, "m1")) == 2
    resumed = mlx_medic("resume", "m1", "--config.file", str(service.config_file), check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert fire(5) == "started"
    wait_until(lambda: len(runs_of(stack, "m1")) == 3, what="a run after resume")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(
        [require_tool("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60
    )


def _issue(name: str, cwd: Path) -> None:
    """An EC key and a certificate for 127.0.0.1 signed by the test CA."""
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "1",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


def test_with_a_client_ca_only_clients_holding_a_certificate_it_signed_get_in(
    stack: Stack,
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=mlx-medic test CA",
        cwd=pki,
    )
    _issue("server", pki)
    _issue("client", pki)
    config = stack.config(
        "tls.yml",
        tls={
            "cert_file": str(pki / "server.crt"),
            "key_file": str(pki / "server.key"),
            "client_ca_file": str(pki / "ca.crt"),
        },
    )
    service = stack.start("--dry-run", config=config)
    url = f"https://127.0.0.1:{service.port}/alerts"
    body = json.dumps(make_payload(make_alert("m1"))).encode()

    def post(context: ssl.SSLContext) -> int:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", **bearer()}
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status)

    trusted = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        post(trusted)  # no client certificate: the handshake fails
    trusted.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    assert post(trusted) == 202


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            {"routing": {"playbooks": {"LLMModelDown": "recover", "SlowDown": "mypkg.mod:Slow"}}},
            "config: routing.playbooks: SlowDown: unknown playbook 'mypkg.mod:Slow' (playbooks:"
            " finish-stop, reboot-node, recover, sweep-orphans)",
        ),
        ({"node": "ai042"}, "config: node: 'ai042' is not a node of the inventory"),
    ],
)
def test_a_config_naming_what_the_remediator_does_not_have_stops_it_with_exit_2(
    tmp_path: Path,
    settings: dict,
    problem: str,
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(inventory_text(tmp_path / "state"))
    config = tmp_path / "remediator.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "inventory": str(inventory),
                "insecure_no_auth": True,
                "journal": str(tmp_path / "journal.sqlite"),
                **settings,
            }
        )
    )
    result = mlx_medic("remediator", "--config.file", str(config), check=False)
    assert result.returncode == 2
    assert problem in result.stderr


# --- credentials: read-only, and rotated without a restart ------------------------------

READER_TOKEN = "reader-token-for-tests"


def auth_service(tmp_path: Path, services: list[Service]) -> tuple[Service, Path]:
    """A real service (its one node answers nobody: nothing here needs it) with a full
    bearer token and a read-only one; the full token's file."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(silent_inventory(tmp_path).model_dump(mode="json")))
    token, reader = tmp_path / "webhook.token", tmp_path / "reader.token"
    token.write_text(TOKEN + "\n")
    reader.write_text(READER_TOKEN + "\n")
    journal = tmp_path / "journal.sqlite"
    config = write_config(
        tmp_path / "remediator.yml",
        {
            "inventory": str(inventory),
            "journal": str(journal),
            "auth": {
                "bearer_token_file": str(token),
                "read_only": {"bearer_token_file": str(reader)},
            },
        },
    )
    service = start_service(config, journal, tmp_path, "--dry-run")
    services.append(service)
    return service, token


def api_status(service: Service, token: str) -> int:
    return http("GET", service.url + "/api/remediations", headers=bearer(token))[0]


def rotate(path: Path, secret: str) -> None:
    """As an operator rotates a secret: a new file moved over the old one."""
    new = path.with_suffix(".new")
    new.write_text(secret + "\n")
    os.replace(new, path)


def logged(service: Service, level: str, start: str) -> list[str]:
    return [
        line["msg"]
        for line in service.log_lines()
        if line.get("level") == level and line.get("msg", "").startswith(start)
    ]


def test_the_read_only_token_reads_and_is_forbidden_to_post_alerts(
    tmp_path: Path, services: list[Service]
) -> None:
    service, _ = auth_service(tmp_path, services)
    for path in ("/", "/api/remediations", "/metrics"):
        assert http("GET", service.url + path, headers=bearer(READER_TOKEN))[0] == 200
    status, body = post_alerts(service, make_payload(make_alert("m1")), bearer(READER_TOKEN))
    assert (status, body["reason"]) == (403, "read-only credentials may not post alerts")
    (listening,) = [line for line in service.log_lines() if line.get("msg") == "listening"]
    assert (listening["auth"], listening["read_only_auth"]) == ("bearer", "bearer")


def test_a_token_file_replaced_on_disk_is_in_force_within_a_second_without_a_restart(
    tmp_path: Path, services: list[Service]
) -> None:
    service, token = auth_service(tmp_path, services)
    assert api_status(service, TOKEN) == 200
    rotate(token, "rotated-token")
    wait_until(lambda: api_status(service, TOKEN) == 401, timeout=5, what="the old token refused")
    assert api_status(service, "rotated-token") == 200
    assert logged(service, "info", "credentials reloaded (a credentials file changed)")


def test_sighup_reloads_the_credentials_and_a_failed_reload_keeps_the_old_ones(
    tmp_path: Path, services: list[Service]
) -> None:
    service, token = auth_service(tmp_path, services)
    token.write_text("\n")  # a rotation gone wrong: the file emptied
    service.proc.send_signal(signal.SIGHUP)
    failed = wait_until(lambda: logged(service, "error", "credentials not reloaded"))
    assert failed == [
        "credentials not reloaded (SIGHUP); the old ones stay in force:"
        f" the bearer token file {token} is empty"
    ]
    assert api_status(service, TOKEN) == 200
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert "mlx_medic_credentials_reload_failures_total 1.0" in metrics
    token.write_text("rotated-token\n")
    service.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: logged(service, "info", "credentials reloaded (SIGHUP)"))
    assert (api_status(service, TOKEN), api_status(service, "rotated-token")) == (401, 200)
    assert service.proc.poll() is None  # SIGHUP reloads; it no longer ends the service
