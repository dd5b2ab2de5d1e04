"""What on-call sees (issue 26): nothing that needs a person is pushed out by repeats, and
no label is shown, stored or echoed whole. In-process: the real journal, engine and app."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.label_limits import LABEL_VALUE_BYTES, MAX_LABELS
from mlx_medic.remediator.webapp import make_app
from tests.remediator.conftest import FakeEngine, make_alert, make_payload
from tests.remediator.engine_fakes import (
    MODEL,
    GatedPlaybook,
    make_config,
    make_engine,
    make_inventory,
)
from tests.remediator.test_cli import cli, config_of, write_config

NEEDING_A_PERSON = ("unknown_model", "invalid", "unrouted")


def burst_then_three_that_need_a_person(journal: Journal, now: float) -> None:
    """A run started, 3,000 repeats absorbed by it (written as the engine writes them:
    deferred), then one unknown_model, one invalid and one unrouted decision."""
    journal.add_event("started", now=now, model=MODEL, run_id=1, detail="run 1 queued (recover)")
    for n in range(3000):
        journal.add_event(
            "absorbed",
            now=now + 1 + n / 1000,
            model=MODEL,
            fingerprint=f"{n:016x}",
            run_id=1,
            detail="run 1 is already queued",
            defer=True,
        )
    journal.flush()
    journal.add_event("unknown_model", now=now + 5, detail="label model='nope' names no model")
    journal.add_event("invalid", now=now + 6, detail="alerts[0].labels.model: missing")
    journal.add_event("unrouted", now=now + 7, detail="no playbook for alert 'DiskFull'")


def test_after_a_burst_of_3000_repeats_the_journal_folds_them_and_keeps_each_that_needs_a_person(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    burst_then_three_that_need_a_person(journal, now=1000.0)
    decisions = journal.recent_decisions(limit=10)
    assert [(d.kind, d.count) for d in decisions] == [
        ("unrouted", 1),
        ("invalid", 1),
        ("unknown_model", 1),
        ("absorbed", 3000),
        ("started", 1),
    ]
    absorbed = decisions[3]
    assert (absorbed.first, absorbed.last) == (1001.0, 1001.0 + 2999 / 1000)
    shown = absorbed.to_dict()  # as `log --json` and the API give it: times ISO 8601 UTC
    assert shown["count"] == 3000
    assert (shown["first"], shown["last"]) == ("1970-01-01T00:16:41Z", "1970-01-01T00:16:43Z")


def test_a_decision_that_needs_a_person_is_shown_however_much_came_after_it(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    journal.add_event("unknown_model", now=1.0, detail="label model='nope' names no model")
    for n in range(30):  # more runs than are shown, each with its repeats
        journal.add_event("started", now=10 + n, model=MODEL, run_id=n, detail=f"run {n} queued")
        for _ in range(100):
            journal.add_event(
                "duplicate", now=10 + n, model=MODEL, detail="already handled", defer=True
            )
    decisions = journal.recent_decisions(limit=5)
    assert [d.kind for d in decisions[:5]] == ["duplicate", "started"] * 2 + ["duplicate"]
    assert {d.count for d in decisions if d.kind == "duplicate"} == {100}
    assert decisions[-1].kind == "unknown_model"


def test_identical_decisions_that_need_a_person_are_one_entry_with_their_count(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    for n in range(500):
        journal.add_event(
            "unknown_model", now=n, detail="label model='a' names no model", defer=True
        )
    journal.add_event("unknown_model", now=600, detail="label model='b' names no model")
    decisions = journal.recent_decisions(limit=10)
    assert [(d.detail[:15], d.count, d.first) for d in decisions] == [
        ("label model='b'", 1, 600.0),
        ("label model='a'", 500, 0.0),
    ]


def test_mlx_medic_log_shows_the_folded_burst_with_its_count_and_each_that_needs_a_person(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    burst_then_three_that_need_a_person(Journal(config_of(config_file).journal), time.time() - 60)
    assert cli(["log", "--config.file", str(config_file)]) == 0
    decisions = capsys.readouterr().out.split("RECENT DECISIONS", 1)[1].splitlines()[1:]
    kinds = [line.split()[1] for line in decisions if line[:1].isdigit()]
    assert kinds == [*reversed(NEEDING_A_PERSON), "absorbed", "started"]
    assert any(line.strip().startswith("×3000 from ") for line in decisions)


@pytest.fixture
async def app_on_journal(tmp_path: Path, web_config: Any) -> AsyncIterator[TestClient]:
    """The real app (no auth) reading a real journal filled with the burst."""
    journal = Journal(tmp_path / "journal.sqlite")
    burst_then_three_that_need_a_person(journal, time.time() - 60)
    app = make_app(FakeEngine(), journal, web_config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_the_page_and_the_api_show_the_folded_burst_and_each_that_needs_a_person(
    app_on_journal: TestClient,
) -> None:
    api = await (await app_on_journal.get("/api/remediations?limit=10")).json()
    shown = [(d["kind"], d["count"]) for d in api["decisions"]]
    assert shown == [
        ("unrouted", 1),
        ("invalid", 1),
        ("unknown_model", 1),
        ("absorbed", 3000),
        ("started", 1),
    ]
    absorbed = api["decisions"][3]
    assert absorbed["first"] < absorbed["last"] == absorbed["time"]
    assert absorbed["detail"] == "run 1 is already queued" and absorbed["run_id"] == 1

    page = await (await app_on_journal.get("/")).text()
    table = page.split("Recent decisions", 1)[1]
    assert table.count("<tr>") == 1 + 5  # the header and five decisions
    assert "×3000 from " in table
    for kind in NEEDING_A_PERSON:
        assert f'<td data-label="Decision">{kind}</td>' in table


# --- bounded text ------------------------------------------------------------------


@pytest.fixture
async def webhook(tmp_path: Path, engines: list[Engine]) -> AsyncIterator[TestClient]:
    """The real app, engine and journal; a gated playbook holds each model's run."""
    gate = GatedPlaybook()
    config = make_config(tmp_path, "gated", max_body_bytes=2 * 1024 * 1024)
    engine = make_engine(config, make_inventory(), playbooks={"gated": gate}, tmp_path=tmp_path)
    engines.append(engine)
    app = make_app(engine, engine.journal, config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        yield client
        gate.release.set()
        await engine.wait_idle()


async def post(client: TestClient, *alerts: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/alerts", json=make_payload(*alerts))
    assert response.status == 202
    answer: dict[str, Any] = await response.json()
    return answer


async def test_through_the_webhook_repeats_fold_and_what_needs_a_person_stays(
    webhook: TestClient,
) -> None:
    await post(webhook, make_alert(MODEL, fingerprint="f" * 16))
    for n in range(200):  # new firings of the model while its run is held: absorbed
        await post(webhook, make_alert(MODEL, fingerprint=f"{n:016x}"))
    await post(webhook, make_alert("nope", fingerprint="a" * 16))
    await post(webhook, make_alert(None, fingerprint="b" * 16))  # no model label: invalid
    await post(webhook, make_alert(MODEL, alertname="DiskFull", fingerprint="c" * 16))

    api = await (await webhook.get("/api/remediations?limit=3")).json()
    shown = [(d["kind"], d["count"]) for d in api["decisions"]]
    assert shown[:3] == [("unrouted", 1), ("invalid", 1), ("unknown_model", 1)]
    assert ("absorbed", 200) in shown


async def test_a_500_kb_label_is_cut_where_it_is_stored_shown_and_echoed(
    webhook: TestClient, tmp_path: Path
) -> None:
    huge = "x" * 500_000
    marker = "…[cut, 500000 bytes]"
    many = {f"extra{n:02}": "v" for n in range(2 * MAX_LABELS)}
    answer = await post(
        webhook,
        make_alert(MODEL, labels={"details": huge, **many}),
        make_alert(huge, fingerprint="e" * 16),  # as the model label: no such model
    )
    started, unknown = answer["alerts"]
    assert started["disposition"] == "started"
    assert unknown["disposition"] == "unknown_model"
    assert unknown["model"].endswith(marker)
    assert len(unknown["model"].encode()) <= LABEL_VALUE_BYTES
    assert len(json.dumps(answer)) < 4 * LABEL_VALUE_BYTES

    # Stored: the run's labels in the journal's row, at most MAX_LABELS of them.
    with sqlite3.connect(tmp_path / "journal" / "journal.sqlite") as db:
        (stored,) = db.execute("SELECT labels FROM runs").fetchone()
    labels = json.loads(stored)
    assert labels["details"].endswith(marker) and len(labels) == MAX_LABELS
    assert labels["model"] == MODEL and labels["alertname"] == "LLMModelDown"
    assert len(stored) < MAX_LABELS * 64 + 2 * LABEL_VALUE_BYTES

    # Shown: the API and the page stay small.
    api = await (await webhook.get("/api/remediations")).text()
    page = await (await webhook.get("/")).text()
    assert json.loads(api)["runs"][0]["labels"]["details"].endswith(marker)
    assert marker in page
    assert len(api.encode()) < 20_000 and len(page.encode()) < 30_000


def test_labels_stored_whole_by_an_older_version_are_cut_when_read(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="manual", owner="h:1", now=1.0
    )
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        db.execute("UPDATE runs SET labels=? WHERE id=?", (json.dumps({"a": "y" * 10**5}), run_id))
    run = journal.get_run(run_id)
    assert run is not None and run.labels["a"].endswith("…[cut, 100000 bytes]")
