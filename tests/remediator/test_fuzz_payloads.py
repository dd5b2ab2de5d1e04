"""Thousands of generated deliveries, valid and broken, against the app in-process with
the real engine and journal (dry run: no lock, no node asked): never a 5xx; a body that is not
an Alertmanager payload reaches nothing and starts no run; inside a payload, an alert that
fails validation never reaches `submit` and is journaled as invalid, while the valid
alerts beside it do reach it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.remediator.alerts import AlertEvent, Disposition, InvalidAlert
from mlx_medic.remediator.auth import CredentialStore
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.payload import PayloadError, parse_payload, to_events
from mlx_medic.remediator.webapp import make_app
from mlx_medic.transport import LocalTransport
from tests.remediator.conftest import bearer
from tests.remediator.engine_fakes import Health

FUZZ = settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# Text that is hard on every layer: shell and path metacharacters, control characters,
# NUL, surrogate-free unicode.
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "; $(touch CANARY)",
            "`touch CANARY`",
            "../../etc/passwd",
            "a\nb",
            "\x00",
            "m1\x00",
            "' OR 1=1 --",
            "<script>",
            "m1",
            "m2",
            "",
            " m1",
        ]
    ),
)
labels = st.dictionaries(st.text(max_size=12), hostile_text, max_size=5)
times = st.sampled_from(
    [
        "2026-11-30T01:02:03Z",
        "2026-11-30T01:02:03.123456789+01:00",
        "0001-01-01T00:00:00Z",
        "2026-11-30T01:02:03",
        "yesterday",
        "",
    ]
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def alerts(draw: st.DrawFn) -> dict[str, Any]:
    alert_labels = draw(labels)
    if draw(st.booleans()):
        alert_labels["alertname"] = draw(st.sampled_from(["LLMModelDown", "Other", ""]))
    if draw(st.booleans()):
        alert_labels["model"] = draw(hostile_text)
    return {
        "status": draw(st.sampled_from(["firing", "resolved", "pending"])),
        "labels": alert_labels,
        "annotations": draw(labels),
        "startsAt": draw(times),
        "endsAt": draw(times),
        "generatorURL": draw(st.text(max_size=20)),
        "fingerprint": draw(st.text(alphabet="0123456789abcdef", max_size=17)),
    }


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "version": draw(st.sampled_from(["4", "4", "4", "3", 4, None])),
        "groupKey": draw(st.text(max_size=30)),
        "truncatedAlerts": draw(st.sampled_from([0, 0, 3, -1, "0"])),
        "status": draw(st.sampled_from(["firing", "resolved", "bogus"])),
        "receiver": draw(st.text(max_size=10)),
        "groupLabels": draw(labels),
        "commonLabels": draw(labels),
        "commonAnnotations": draw(labels),
        "externalURL": "http://am.example",
        "alerts": draw(st.lists(alerts(), max_size=4)),
    }


@st.composite
def broken_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A payload with one field removed or replaced by arbitrary JSON."""
    payload = draw(payloads())
    key = draw(st.sampled_from(sorted(payload)))
    if draw(st.booleans()):
        del payload[key]
    else:
        payload[key] = draw(json_values)
    return payload


valid_times = st.datetimes(
    min_value=datetime(2020, 1, 1),
    max_value=datetime(2030, 1, 1),
    timezones=st.just(UTC),
).map(lambda t: t.isoformat().replace("+00:00", "Z"))


@st.composite
def valid_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """Always valid: routed or not, known model or not, hostile values anywhere."""
    alert_list = []
    for _ in range(draw(st.integers(1, 3))):
        alert_labels = draw(labels)
        alert_labels["alertname"] = draw(
            st.sampled_from(["LLMModelDown", "Other"]) | hostile_text.filter(bool)
        )
        alert_labels["model"] = draw(st.sampled_from(["m1", "m2"]) | hostile_text.filter(bool))
        alert_list.append(
            {
                "status": draw(st.sampled_from(["firing", "resolved"])),
                "labels": alert_labels,
                "annotations": draw(labels),
                "startsAt": draw(valid_times),
                "endsAt": draw(valid_times),
                "generatorURL": "",
                "fingerprint": draw(st.text(min_size=1, max_size=20)),
            }
        )
    return {
        "version": "4",
        "groupKey": draw(st.text(max_size=30)),
        "truncatedAlerts": 0,
        "status": draw(st.sampled_from(["firing", "resolved"])),
        "receiver": "mlx-medic",
        "groupLabels": {},
        "commonLabels": draw(labels),
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": alert_list,
    }


bodies = st.one_of(
    valid_payloads().map(lambda p: json.dumps(p).encode()),
    valid_payloads().map(lambda p: json.dumps(p).encode()),
    payloads().map(lambda p: json.dumps(p).encode()),
    broken_payloads().map(lambda p: json.dumps(p).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)


class RecordingEngine:
    """The real engine; remembers every event and invalid alert that reached it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events: list[AlertEvent] = []
        self.rejected: list[InvalidAlert] = []

    async def submit(self, event: AlertEvent) -> Disposition:
        self.events.append(event)
        return await self.engine.submit(event)

    def reject(self, invalid: InvalidAlert) -> Disposition:
        self.rejected.append(invalid)
        return self.engine.reject(invalid)

    def journal_problem(self) -> str | None:
        return self.engine.journal_problem()


def fuzz_inventory(tmp_path: Path) -> str:
    model = {
        "model": "tiny",
        "nodes": ["ai001"],
        "port": 1,
        "service": {"manager": "supervisord", "label": "x"},
        "backends": {"ring": {"hostfile": str(tmp_path / "ring.json")}},
    }
    return json.dumps(
        {
            "state_dir": str(tmp_path / "state"),
            "nodes": {"ai001": {"ssh": "127.0.0.1"}},
            "models": {"m1": model, "m2": {**model, "port": 2}},
        }
    )


class Harness:
    """One event loop, app, engine and client for a whole hypothesis run."""

    def __init__(self, config: RemediatorConfig, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        config = config.model_copy(update={"dry_run": True})
        self.journal = Journal(config.journal)
        inventory = parse_inventory(fuzz_inventory(tmp_path))
        transport = LocalTransport()

        async def start() -> tuple[RecordingEngine, TestClient]:
            engine = Engine(
                config,
                inventory,
                self.journal,
                transport,
                health_check=Health(up=False),
                registry=CollectorRegistry(),
            )
            await engine.start()
            recording = RecordingEngine(engine)
            app = make_app(
                recording, self.journal, config, CollectorRegistry(), CredentialStore(config.auth)
            )
            client = TestClient(TestServer(app))
            await client.start_server()
            return recording, client

        self.engine, self.client = self.loop.run_until_complete(start())

    def runs(self) -> int:
        return len(self.journal.list_runs(limit=10_000))

    def post(self, body: bytes, content_type: str = "application/json") -> int:
        async def go() -> int:
            response = await self.client.post(
                "/alerts", data=body, headers={"Content-Type": content_type, **bearer()}
            )
            await response.read()
            return response.status

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.run_until_complete(self.engine.engine.close())
        self.journal.close()
        self.loop.close()


@pytest.fixture
def harness(web_config: RemediatorConfig, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(web_config, tmp_path)
    yield h
    h.close()


def read_by_validation(body: bytes) -> list[AlertEvent | InvalidAlert] | None:
    """Each alert as validation reads it, or None for a body that is no payload at all."""
    try:
        return to_events(parse_payload(body))
    except PayloadError:
        return None


@FUZZ
@given(body=bodies)
def test_no_generated_body_gets_a_5xx_and_invalid_alerts_never_reach_submit(
    harness: Harness,
    body: bytes,
) -> None:
    engine = harness.engine
    before, rejected_before, runs_before = len(engine.events), len(engine.rejected), harness.runs()
    journaled_before = len(harness.journal.list_events(kind="invalid", limit=100_000))
    status = harness.post(body)
    assert status < 500
    alerts = read_by_validation(body)
    if alerts is None:
        assert status == 400
        assert len(engine.events) == before, "an invalid delivery reached the engine"
        assert len(engine.rejected) == rejected_before
        assert harness.runs() == runs_before, "an invalid delivery started a run"
        return
    assert status == 202
    valid = [a for a in alerts if isinstance(a, AlertEvent)]
    invalid = [a for a in alerts if isinstance(a, InvalidAlert)]
    assert engine.events[before:] == valid, "a valid alert beside an invalid one was lost"
    assert engine.rejected[rejected_before:] == invalid
    journaled = harness.journal.list_events(kind="invalid", limit=100_000)
    assert len(journaled) - journaled_before == len(invalid), "an invalid alert went unjournaled"


@FUZZ
@given(
    body=payloads().map(lambda p: json.dumps(p).encode()),
    content_type=st.sampled_from(
        [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "application/jsonx",
        ]
    ),
)
def test_a_wrong_content_type_is_refused_whatever_the_body(
    harness: Harness,
    body: bytes,
    content_type: str,
) -> None:
    before = len(harness.engine.events)
    assert harness.post(body, content_type) == 415
    assert len(harness.engine.events) == before


def test_invalid_deliveries_alone_start_no_run(harness: Harness) -> None:
    for body in [json.dumps({"version": "4"}).encode(), b"\x00", b"[]"]:
        assert harness.post(body) == 400
    assert harness.engine.events == [] and harness.runs() == 0
