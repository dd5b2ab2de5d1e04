"""A flood on the webhook (issue 27): each delivery and each second bring at most so many new
alerts, the rest is answered 503 (Alertmanager retries it) and the retry resumes where the
last try stopped, so nothing taken is lost or taken twice; /healthz answers meanwhile, and a
flood of empty alerts is a handful of journal rows. In-process: the real journal, engine
and app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.webapp import make_app
from tests.remediator.conftest import make_alert, make_payload
from tests.remediator.engine_fakes import MODEL, make_config, make_engine, make_inventory

Webhook = tuple[TestClient, Engine]
StartWebhook = Callable[..., Awaitable[Webhook]]


@pytest.fixture
async def start_webhook(tmp_path: Path, engines: list[Engine]) -> AsyncIterator[StartWebhook]:
    """Starts the real app, engine and journal with the limits given."""
    clients: list[TestClient] = []

    async def start(**limits: int) -> Webhook:
        config = make_config(tmp_path, max_body_bytes=2 * 1024 * 1024, **limits)
        engine = make_engine(config, make_inventory(), tmp_path=tmp_path)
        engines.append(engine)
        app = make_app(engine, engine.journal, config, CollectorRegistry(), None)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client, engine

    yield start
    for client in clients:
        await client.close()


def unrouted(count: int) -> list[dict[str, Any]]:
    """Alerts with no playbook: each is journaled as `unrouted`, none starts a run."""
    return [make_alert(MODEL, alertname="DiskFull", fingerprint=f"{n:016x}") for n in range(count)]


def body_of(alerts: list[Any]) -> bytes:
    return json.dumps(make_payload(alerts=alerts)).encode()


async def deliver(client: TestClient, body: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
    response = await client.post("/alerts", data=body, headers={"Content-Type": "application/json"})
    return response.status, await response.json(), dict(response.headers)


def journaled(engine: Engine, kind: str) -> list[Any]:
    return engine.journal.list_events(kind=kind, limit=100_000)


async def test_a_delivery_over_the_cap_is_503_and_its_retries_journal_every_alert_once(
    start_webhook: StartWebhook,
) -> None:
    client, engine = await start_webhook(alerts_per_delivery=100, alerts_per_second=0)
    body = body_of(unrouted(250))

    answers = [await deliver(client, body)]
    while answers[-1][0] == 503 and len(answers) < 10:  # Alertmanager's retries
        answers.append(await deliver(client, body))

    assert [(status, answer.get("resumes_at")) for status, answer, _ in answers] == [
        (503, 100),
        (503, 200),
        (202, None),
    ]
    first = answers[0][1]
    assert "alerts_per_delivery=100" in first["reason"]
    assert "max_alerts" in first["reason"]
    assert [a["index"] for a in first["alerts"]] == list(range(100))
    per_alert = Counter(e.fingerprint for e in journaled(engine, "unrouted"))
    assert len(per_alert) == 250 and set(per_alert.values()) == {1}, "lost or taken twice"
    assert len(journaled(engine, "deferred")) == 2, "one event per delivery cut short"
    metrics = await (await client.get("/metrics")).text()
    assert 'mlx_medic_deliveries_deferred_total{limit="alerts_per_delivery"} 2.0' in metrics


async def test_already_handled_firings_take_no_part_of_the_cap(
    start_webhook: StartWebhook,
) -> None:
    client, _ = await start_webhook(alerts_per_delivery=3, alerts_per_second=0)
    firing = make_alert(MODEL, fingerprint="a" * 16)
    assert (await deliver(client, body_of([firing])))[0] == 202  # starts a run

    status, answer, _ = await deliver(client, body_of([firing] * 3 + unrouted(3)))

    assert status == 202
    assert [a["disposition"] for a in answer["alerts"]] == ["duplicate"] * 3 + ["unrouted"] * 3


async def test_past_alerts_per_second_the_answer_is_503_with_retry_after(
    start_webhook: StartWebhook,
) -> None:
    client, engine = await start_webhook(alerts_per_delivery=0, alerts_per_second=50)

    body = body_of(unrouted(80))
    status, answer, headers = await deliver(client, body)

    assert status == 503
    assert 50 <= answer["resumes_at"] < 60  # the bucket refills while it takes them
    assert "alerts_per_second=50" in answer["reason"]
    assert int(headers["Retry-After"]) >= 1
    await asyncio.sleep(1.0)  # the bucket refills; the retry takes the rest
    assert (await deliver(client, body))[0] == 202
    assert len(journaled(engine, "unrouted")) == 80


async def test_a_delivery_of_10000_empty_alerts_is_a_handful_of_journal_rows(
    start_webhook: StartWebhook,
) -> None:
    client, engine = await start_webhook()

    status, answer, _ = await deliver(client, body_of([{}] * 10_000))

    assert status == 202
    invalid = journaled(engine, "invalid")
    assert len(invalid) <= 6
    assert answer["invalid_folded"] == 9_995
    assert "9995 more invalid alerts" in invalid[0].detail
    assert "alerts[5]" in invalid[0].detail and "alerts[9999]" in invalid[0].detail
    assert "required field is missing" in invalid[0].detail


async def test_healthz_answers_while_a_huge_delivery_is_read(
    start_webhook: StartWebhook,
) -> None:
    client, _ = await start_webhook()
    delivery = asyncio.create_task(deliver(client, body_of([{}] * 60_000)))
    latencies = []
    while not delivery.done():
        started = time.perf_counter()
        assert (await client.get("/healthz")).status == 200
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
    assert (await delivery)[0] == 202
    assert len(latencies) >= 5, "the delivery was over before /healthz was asked"
    assert max(latencies) < 0.5
