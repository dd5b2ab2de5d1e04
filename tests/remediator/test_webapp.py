"""The HTTP contract with Alertmanager and on-call, in-process around a recording engine."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.auth import CredentialStore
from mlx_medic.remediator.config import RemediatorConfig, SecretFiles
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.outcomes import RunOutcome, StepOutcome
from mlx_medic.remediator.webapp import make_app
from tests.remediator.conftest import (
    FakeEngine,
    FakeJournal,
    basic,
    bearer,
    make_alert,
    make_payload,
)


async def post(
    client: TestClient, body: Any, headers: dict[str, str] | None = None, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(
        "/alerts",
        data=data,
        headers={"Content-Type": "application/json", **(bearer() if headers is None else headers)},
        **kwargs,
    )
    return response.status, await response.json()


async def test_a_valid_delivery_is_accepted_with_each_alerts_disposition(
    client: TestClient,
    fake_engine: FakeEngine,
) -> None:
    status, body = await post(
        client,
        make_payload(make_alert("m1", fingerprint="aa"), make_alert("nope", fingerprint="bb")),
    )
    assert status == 202
    assert [(a["fingerprint"], a["model"], a["disposition"]) for a in body["alerts"]] == [
        ("aa", "m1", "started"),
        ("bb", "nope", "unknown_model"),
    ]
    assert [e.fingerprint for e in fake_engine.events] == ["aa", "bb"]


async def test_basic_auth_is_accepted_too(client: TestClient) -> None:
    status, _ = await post(client, make_payload(), basic())
    assert status == 202


@pytest.mark.parametrize(
    "headers, reason",
    [
        ({}, "no credentials"),
        (bearer("wrong"), "wrong bearer token"),
        (basic(password="wrong"), "wrong basic credentials"),
        (basic(user="mallory"), "wrong basic credentials"),
    ],
)
async def test_missing_or_wrong_credentials_get_401_with_a_challenge(
    client: TestClient,
    fake_engine: FakeEngine,
    headers: dict[str, str],
    reason: str,
) -> None:
    response = await client.post("/alerts", json=make_payload(), headers=headers)
    assert response.status == 401
    assert (await response.json())["reason"] == reason
    challenges = response.headers.getall("WWW-Authenticate")
    assert 'Bearer realm="mlx-medic"' in challenges
    assert any(c.startswith('Basic realm="mlx-medic"') for c in challenges)
    assert fake_engine.events == []


@pytest.mark.parametrize("path", ["/", "/api/remediations", "/metrics"])
async def test_the_page_api_and_metrics_need_the_same_credentials(
    client: TestClient,
    path: str,
) -> None:
    assert (await client.get(path)).status == 401
    assert (await client.get(path, headers=basic())).status == 200


async def test_healthz_needs_no_credentials(client: TestClient) -> None:
    response = await client.get("/healthz")
    assert response.status == 200 and (await response.json()) == {"status": "ok"}


READER_TOKEN = "reader-token-for-tests"


@contextlib.asynccontextmanager
async def client_with_auth(
    web_config: RemediatorConfig, tmp_path: Path, **auth: Any
) -> AsyncIterator[tuple[TestClient, FakeEngine]]:
    """The real app whose auth is the fixture's plus `auth`, and its recording engine."""
    reader = tmp_path / "reader.token"
    reader.write_text(READER_TOKEN + "\n")
    auth_config = web_config.auth.model_copy(update=auth)
    config = web_config.model_copy(update={"auth": auth_config})
    engine = FakeEngine()
    app = make_app(engine, FakeJournal(), config, CollectorRegistry(), CredentialStore(auth_config))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client, engine


@pytest.mark.parametrize("path", ["/", "/api/remediations", "/metrics"])
async def test_a_read_only_token_reads_the_page_api_and_metrics(
    web_config: RemediatorConfig, tmp_path: Path, path: str
) -> None:
    read_only = SecretFiles(bearer_token_file=tmp_path / "reader.token")
    async with client_with_auth(web_config, tmp_path, read_only=read_only) as (client, _):
        assert (await client.get(path, headers=bearer(READER_TOKEN))).status == 200
        assert (await client.get(path, headers=bearer())).status == 200
        assert (await client.get(path, headers=bearer("wrong"))).status == 401


async def test_a_read_only_token_on_the_webhook_gets_403_saying_it_is_read_only(
    web_config: RemediatorConfig, tmp_path: Path
) -> None:
    read_only = SecretFiles(bearer_token_file=tmp_path / "reader.token")
    async with client_with_auth(web_config, tmp_path, read_only=read_only) as (client, engine):
        status, body = await post(client, make_payload(), bearer(READER_TOKEN))
        assert (status, body) == (
            403,
            {"status": "forbidden", "reason": "read-only credentials may not post alerts"},
        )
        assert engine.events == []
        assert (await post(client, make_payload(), bearer()))[0] == 202


@pytest.mark.parametrize("path", ["/", "/api/remediations", "/metrics"])
async def test_open_reading_serves_the_page_api_and_metrics_without_credentials(
    web_config: RemediatorConfig, tmp_path: Path, path: str
) -> None:
    async with client_with_auth(web_config, tmp_path, read_only_open=True) as (client, engine):
        assert (await client.get(path)).status == 200
        status, body = await post(client, make_payload(), {})
        assert (status, body["reason"]) == (401, "no credentials")
        assert engine.events == []


async def test_metrics_count_the_failed_reloads_of_the_credentials(
    web_config: RemediatorConfig, tmp_path: Path
) -> None:
    async with client_with_auth(web_config, tmp_path) as (client, _):
        metrics = await (await client.get("/metrics", headers=bearer())).text()
        assert "mlx_medic_credentials_reload_failures_total 0.0" in metrics


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"{oops", "body is not valid JSON"),
        (b"", 'body is empty: expected an Alertmanager webhook JSON payload (version "4")'),
        (b"  \n\t", "body is empty"),  # blank is empty, not JSON's "Expecting value"
        (b"null", "payload must be a JSON object, got null"),
        (make_payload(version="3"), 'unsupported payload version "3"'),
        ({"version": "4"}, "groupKey: required field is missing"),
        (make_payload(alerts={"0": make_alert()}), "alerts: Input should be a valid list"),
    ],
)
async def test_a_body_that_is_no_alertmanager_payload_at_all_gets_400_with_the_reason(
    client: TestClient,
    fake_engine: FakeEngine,
    body: Any,
    reason: str,
) -> None:
    status, answer = await post(client, body)
    assert status == 400
    assert reason in answer["reason"]
    assert fake_engine.events == []


async def test_an_invalid_alert_gets_its_own_disposition_and_the_valid_ones_still_act(
    client: TestClient,
    fake_engine: FakeEngine,
) -> None:
    """Alertmanager does not retry a 4xx: a 400 for the whole delivery would lose the
    valid firings beside a bad one."""
    status, body = await post(
        client,
        make_payload(
            make_alert("m1", fingerprint="aa"),
            make_alert(None, fingerprint="bb"),
            make_alert("m2", fingerprint="cc"),
        ),
    )
    assert status == 202
    assert [(a["index"], a["fingerprint"], a["disposition"]) for a in body["alerts"]] == [
        (0, "aa", "started"),
        (1, "bb", "invalid"),
        (2, "cc", "started"),
    ]
    assert body["alerts"][1]["reason"] == (
        "alerts[1].labels.model: alert \"LLMModelDown\" needs the 'model' label naming the model"
    )
    assert [e.fingerprint for e in fake_engine.started] == ["aa", "cc"]
    assert [(i.index, i.fingerprint) for i in fake_engine.rejected] == [(1, "bb")]


async def test_when_the_journal_cannot_record_a_delivery_gets_503_and_reaches_nothing(
    client: TestClient,
    fake_engine: FakeEngine,
) -> None:
    fake_engine.problem = "cannot write the journal /j.sqlite: database or disk is full"
    status, body = await post(client, make_payload(make_alert("m1"), make_alert(None)))
    assert status == 503
    assert body == {
        "status": "unavailable",
        "reason": "the journal cannot record, so nothing"
        " acts: cannot write the journal /j.sqlite: database or disk is full",
    }
    assert fake_engine.events == [] and fake_engine.rejected == []
    health = await client.get("/healthz")
    assert health.status == 503
    assert (await health.json())["status"] == "failing"
    assert "/j.sqlite" not in await health.text()  # details only behind credentials
    page = await (await client.get("/", headers=basic())).text()
    assert "The journal is failing" in page and "database or disk is full" in page


async def post_as(
    client: TestClient, content_type: str | None, body: bytes
) -> tuple[int, dict[str, Any]]:
    """POST /alerts with this Content-Type header, or none at all."""
    response = await client.post(
        "/alerts",
        data=body,
        headers={**bearer(), **({} if content_type is None else {"Content-Type": content_type})},
        skip_auto_headers=["Content-Type"],
    )
    return response.status, await response.json()


@pytest.mark.parametrize(
    "content_type, shown",
    [
        ("text/plain", "text/plain"),
        ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),  # curl -d
        (None, "none (no Content-Type header)"),
    ],
)
async def test_a_body_not_sent_as_json_gets_415_naming_the_type_sent_and_the_one_expected(
    client: TestClient,
    fake_engine: FakeEngine,
    content_type: str | None,
    shown: str,
) -> None:
    status, answer = await post_as(client, content_type, json.dumps(make_payload()).encode())
    assert status == 415  # Unsupported Media Type: the header is wrong, not the payload
    assert answer == {
        "status": "rejected",
        "reason": f"content type must be application/json, got {shown}",
    }
    assert fake_engine.events == [] and fake_engine.rejected == []


async def test_json_with_a_charset_parameter_is_json(client: TestClient) -> None:
    status, _ = await post_as(
        client, "application/json; charset=utf-8", json.dumps(make_payload()).encode()
    )
    assert status == 202


async def test_every_refused_delivery_counts_as_invalid_and_logs_its_reason_whatever_its_status(
    client: TestClient,
    fake_engine: FakeEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 415, an empty body and a bad one are refused alike: counted, logged with the
    reason the sender got, and nothing reaches the engine (so nothing is journaled)."""
    with caplog.at_level(logging.INFO, logger="mlx_medic.remediator.web"):
        wrong_type = await post_as(client, "text/plain", json.dumps(make_payload()).encode())
        empty = await post(client, b"")
        not_json = await post(client, b"{oops")
    answers = [wrong_type, empty, not_json]
    assert [status for status, _ in answers] == [415, 400, 400]
    records = [r for r in caplog.records if r.name == "mlx_medic.remediator.web"]
    assert [(r.status, r.reason) for r in records] == [  # type: ignore[attr-defined]
        (status, answer["reason"]) for status, answer in answers
    ]
    text = await (await client.get("/metrics", headers=bearer())).text()
    assert 'mlx_medic_alerts_received_total{status="invalid"} 3.0' in text
    assert fake_engine.events == [] and fake_engine.rejected == []


async def test_an_oversized_body_gets_413_and_is_not_read(
    client: TestClient,
    fake_engine: FakeEngine,
) -> None:
    payload = make_payload(make_alert(labels={"pad": "x" * 70_000}))
    status, answer = await post(client, payload)
    assert status == 413
    assert answer["reason"] == "body larger than 65536 bytes"
    assert fake_engine.events == []


async def test_an_oversized_chunked_body_gets_413(client: TestClient) -> None:
    async def chunks():  # no Content-Length: the cap must hold on the bytes read
        for _ in range(20):
            yield b" " * 8192

    response = await client.post(
        "/alerts", data=chunks(), headers={"Content-Type": "application/json", **bearer()}
    )
    assert response.status == 413


async def test_metrics_count_received_alerts_by_status(client: TestClient) -> None:
    await post(
        client,
        make_payload(make_alert(fingerprint="a"), make_alert(fingerprint="b", status="resolved")),
    )
    await post(client, b"nope")
    text = await (await client.get("/metrics", headers=bearer())).text()
    assert 'mlx_medic_alerts_received_total{status="firing"} 1.0' in text
    assert 'mlx_medic_alerts_received_total{status="resolved"} 1.0' in text
    assert 'mlx_medic_alerts_received_total{status="invalid"} 1.0' in text


async def test_every_request_decision_is_one_log_line(
    client: TestClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mlx_medic.remediator.web"):
        await post(client, make_payload(make_alert(fingerprint="ff")))
        await post(client, make_payload(version="3"))
        await post(client, make_payload(), bearer("bad"))
    records = [r for r in caplog.records if r.name == "mlx_medic.remediator.web"]
    assert [(r.status, r.path) for r in records] == [  # type: ignore[attr-defined]
        (202, "/alerts"),
        (400, "/alerts"),
        (401, "/alerts"),
    ]
    assert records[0].dispositions == ["started"]  # type: ignore[attr-defined]
    assert records[0].fingerprints == ["ff"]  # type: ignore[attr-defined]
    assert "version" in records[1].reason  # type: ignore[attr-defined]
    assert records[2].reason == "wrong bearer token"  # type: ignore[attr-defined]


async def test_the_api_lists_runs_with_model_since_and_limit(
    client: TestClient,
    fake_journal: FakeJournal,
) -> None:
    fake_journal.runs = [
        {"id": 2, "model": "m1", "outcome": "planned", "steps": []},
        {"id": 1, "model": "m2", "outcome": "failed", "steps": []},
    ]
    response = await client.get("/api/remediations?model=m1&since=2h&limit=5", headers=bearer())
    assert response.status == 200
    assert [r["id"] for r in (await response.json())["runs"]] == [2]
    query = fake_journal.queries[-1]
    assert query["model"] == "m1" and query["limit"] == 5 and query["since"] is not None


@pytest.mark.parametrize(
    "query, reason",
    [
        ("limit=abc", "is not a whole number"),
        ("limit=0", "limit must be between 1 and 500"),
        ("since=yesterday", "is neither a duration"),
    ],
)
async def test_bad_api_queries_get_400_with_the_reason(
    client: TestClient,
    query: str,
    reason: str,
) -> None:
    response = await client.get(f"/api/remediations?{query}", headers=bearer())
    assert response.status == 400
    assert reason in (await response.json())["reason"]


async def test_the_page_escapes_attacker_controlled_values(
    client: TestClient,
    fake_journal: FakeJournal,
) -> None:
    evil = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>\x00"
    fake_journal.runs = [
        {
            "id": 1,
            "model": evil,
            "outcome": "escalated",
            "next_action": evil,
            "detail": evil,
            "alertname": evil,
            "fingerprint": evil,
            "labels": {evil: evil},
            "owner": evil,
            "steps": [
                {
                    "name": evil,
                    "node": evil,
                    "command": [evil, evil],
                    "output": evil,
                    "outcome": evil,
                    "description": evil,
                    "targets": [evil],
                    "detail": evil,
                    "duration_seconds": 0.1,
                }
            ],
        }
    ]
    fake_journal.events = [
        {
            "time": "1970-01-01T00:00:00Z",
            "kind": evil,
            "model": evil,
            "fingerprint": evil,
            "run_id": None,
            "detail": evil,
        }
    ]
    response = await client.get("/", headers=basic())
    html = await response.text()
    assert response.status == 200
    assert "<script>" not in html and "<img" not in html and "\x00" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]


async def test_without_credentials_configured_everything_is_open(
    fake_engine: FakeEngine,
    fake_journal: FakeJournal,
    web_config: Any,
) -> None:
    app = make_app(fake_engine, fake_journal, web_config, CollectorRegistry(), None)
    from aiohttp.test_utils import TestServer

    async with TestClient(TestServer(app)) as open_client:
        assert (await open_client.post("/alerts", json=make_payload())).status == 202
        assert (await open_client.get("/")).status == 200


def test_the_page_colours_every_run_and_step_outcome_and_nothing_else() -> None:
    from mlx_medic.remediator.oncall_page import _OUTCOME_CLASS
    from mlx_medic.remediator.outcomes import RunOutcome, StepOutcome

    assert set(_OUTCOME_CLASS) == {*RunOutcome, *StepOutcome}


async def test_the_api_and_the_page_give_times_in_iso_8601_utc_and_durations_in_seconds(
    tmp_path: Path, web_config: Any
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(
        model="m1", playbook="recover", trigger_kind="manual", owner="h:1", now=1796331929.25
    )
    journal.start_run(run_id, 1796331930.0)
    step_id = journal.begin_step(
        run_id,
        seq=1,
        name="preflight",
        node="ai001",
        command=None,
        description="facts",
        targets=[],
        now=1796331930.0,
    )
    journal.end_step(step_id, StepOutcome.OK, 1796331930.5)
    journal.end_run(run_id, RunOutcome.SUCCEEDED, 1796331932.0, "verified healthy")
    journal.add_event("started", now=1796331929.25, model="m1", run_id=run_id)
    app = make_app(FakeEngine(), journal, web_config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        api = await (await client.get("/api/remediations")).json()
        page = await (await client.get("/")).text()
    (run,) = api["runs"]
    assert (run["queued_at"], run["started_at"], run["ended_at"]) == (
        "2026-12-03T21:05:29Z",
        "2026-12-03T21:05:30Z",
        "2026-12-03T21:05:32Z",
    )
    assert run["duration_seconds"] == 2.0 and "duration" not in run
    assert run["steps"][0]["duration_seconds"] == 0.5
    assert run["steps"][0]["ended_at"] == "2026-12-03T21:05:30Z"
    assert api["decisions"][0]["time"] == "2026-12-03T21:05:29Z"
    assert "2026-12-03T21:05:29Z" in page and "2.0 s" in page and "500 ms" in page


async def test_the_api_and_the_page_show_why_a_run_acted_and_a_planned_step_has_no_duration(
    tmp_path: Path, web_config: Any
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(
        model="m1", playbook="recover", trigger_kind="alert", owner="h:1", now=1.0, dry_run=True
    )
    journal.start_run(run_id, 2.0)
    recheck = "act: m1 is still down: refused (probed 10.0.0.1:8080 from the remediator)"
    journal.record_recheck(run_id, recheck)
    for seq, (name, condition) in enumerate(
        [("verify", None), ("pin-ring", "only if the start fails verification")], 1
    ):
        journal.begin_step(
            run_id,
            seq=seq,
            name=name,
            node="ai001",
            command=None,
            description="what it does",
            targets=[],
            now=3.0,
            outcome=StepOutcome.PLANNED,
            condition=condition,
        )
    journal.end_run(run_id, RunOutcome.PLANNED, 4.0, "dry run: 2 steps planned, nothing executed")
    app = make_app(FakeEngine(), journal, web_config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        api = await (await client.get("/api/remediations")).json()
        page = await (await client.get("/")).text()
    (run,) = api["runs"]
    assert run["recheck"] == recheck
    assert [(s["condition"], s["ended_at"], s["duration_seconds"]) for s in run["steps"]] == [
        (None, None, None),
        ("only if the start fails verification", None, None),
    ]
    assert f"<dt>Re-check</dt><dd>{recheck}</dd>" in page
    assert "only if the start fails verification · what it does" in page
    assert 'class="step-dur"' not in page  # neither step ran
