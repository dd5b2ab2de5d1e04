"""The links a run keeps of the alert that started it (runbook, the alert in Prometheus,
Alertmanager): read from the payload, journaled, and shown on the page, in
`/api/remediations` and in `mlx-medic log`, as links only when http or https."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.remediator import cli_log
from mlx_medic.remediator.alerts import AlertEvent
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, RunView
from mlx_medic.remediator.journal.schema import SCHEMA
from mlx_medic.remediator.label_limits import URL_BYTES
from mlx_medic.remediator.links import bounded_links, refusal
from mlx_medic.remediator.oncall_page import render_page
from mlx_medic.remediator.payload import parse_payload, to_events
from mlx_medic.remediator.webapp import make_app
from tests.remediator.conftest import FakeEngine, make_alert, make_payload
from tests.remediator.engine_fakes import alert, make_config, make_engine, make_inventory

RUNBOOK = "https://runbooks.example/llmmodeldown.md"
GENERATOR = "http://prometheus.example:9090/graph?g0.expr=up%3D%3D0&g0.tab=1"
EXTERNAL = "http://alertmanager.example:9093"
EVIL = "javascript:alert(1)"
LINKS = {"runbook_url": RUNBOOK, "generator_url": GENERATOR, "external_url": EXTERNAL}


def _event(payload: dict[str, Any]) -> AlertEvent:
    (event,) = to_events(parse_payload(json.dumps(payload).encode()))
    assert isinstance(event, AlertEvent)
    return event


# --- what is kept ----------------------------------------------------------------


def test_an_alert_keeps_its_runbook_url_its_generator_url_and_alertmanagers_url() -> None:
    raw = make_alert()
    raw["annotations"]["runbook_url"] = RUNBOOK
    raw["generatorURL"] = GENERATOR
    assert _event(make_payload(raw, externalURL=EXTERNAL)).links == LINKS


def test_links_an_alert_does_not_send_are_not_kept() -> None:
    raw = make_alert()
    raw["generatorURL"] = ""
    assert _event(make_payload(raw, externalURL="")).links == {}


def test_a_link_is_bounded_and_a_cut_one_is_no_link() -> None:
    long = "https://prometheus.example/graph?g0.expr=" + "a" * 10_000
    (kept,) = bounded_links({"generator_url": long}).values()
    assert len(kept.encode()) <= URL_BYTES and kept.endswith("bytes]")
    assert refusal(kept) == f"cut to {URL_BYTES} bytes"


@pytest.mark.parametrize("url", [RUNBOOK, GENERATOR, EXTERNAL, "HTTPS://Example.org/a#b"])
def test_an_absolute_http_or_https_url_is_a_link(url: str) -> None:
    assert refusal(url) is None


@pytest.mark.parametrize(
    "url, why",
    [
        (EVIL, "scheme javascript"),
        ("JaVaScRiPt:alert(1)", "scheme javascript"),
        ("java\tscript:alert(1)", "scheme javascript"),
        ("data:text/html,<script>alert(1)</script>", "scheme data"),
        ("ftp://files.example/x", "scheme ftp"),
        ("/graph?g0.expr=up", "not an absolute URL"),
        ("//evil.example/x", "not an absolute URL"),
        (" https://example.org/", "has spaces or characters outside printable ASCII"),
        ("https://example.org/\x1b[2J", "has spaces or characters outside printable ASCII"),
        ("https:///path-only", "no host"),
        ("http://[::1/", "does not parse as a URL"),
    ],
)
def test_anything_else_is_not_a_link_and_says_why(url: str, why: str) -> None:
    assert refusal(url) == why


# --- the journal -------------------------------------------------------------------


def _alert_run(journal: Journal, links: dict[str, str], fingerprint: str = "fp1") -> int:
    run_id = journal.create_alert_run(
        model="m1",
        playbook="recover",
        owner="h:1",
        now=1000.0,
        alertname="LLMModelDown",
        fingerprint=fingerprint,
        starts_at="2026-12-04T03:00:00+00:00",
        labels={"alertname": "LLMModelDown"},
        dry_run=True,
        links=links,
    )
    assert run_id is not None
    return run_id


def test_a_run_keeps_the_links_of_its_alert_and_a_manual_run_has_none(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    by_alert = _alert_run(journal, {**LINKS, "other": "https://x.example"})
    by_hand = journal.create_run(
        model="m1", playbook="recover", trigger_kind="manual", owner="h:1", now=1.0
    )
    assert journal.get_run(by_alert).links == LINKS  # type: ignore[union-attr]
    assert journal.get_run(by_hand).links == {}  # type: ignore[union-attr]


async def test_the_run_an_alert_starts_keeps_its_links(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = make_engine(make_config(tmp_path, "succeeding"), make_inventory(), tmp_path=tmp_path)
    engines.append(engine)
    await engine.submit(replace(alert(), links=LINKS))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.links == LINKS


def test_a_journal_written_before_links_opens_reads_its_runs_and_gains_the_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite"
    old = sqlite3.connect(path)
    old.executescript(re.sub(r",\n\s+links\s+TEXT[^\n]*", "", SCHEMA))
    assert "links" not in {row[1] for row in old.execute("PRAGMA table_info(runs)")}
    old.execute(
        "INSERT INTO runs (model, playbook, trigger_kind, owner, outcome, queued_at)"
        " VALUES ('m1', 'recover', 'manual', 'h:1', 'succeeded', 1.0)"
    )
    old.commit()
    old.close()
    (run,) = Journal(path).list_runs()
    assert (run.model, run.outcome, run.links) == ("m1", "succeeded", {})
    again = Journal(path)  # opening it again changes nothing
    assert "links" in {row["name"] for row in again._db.execute("PRAGMA table_info(runs)")}
    assert _alert_run(again, LINKS) and again.list_runs()[0].links == LINKS


# --- what on-call sees -------------------------------------------------------------


class _Hrefs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.hrefs += [found["href"] or ""] if "href" in found else []
        self.ids += [found["id"] or ""] if "id" in found else []


def _runs(tmp_path: Path) -> tuple[Journal, list[RunView]]:
    journal = Journal(tmp_path / "journal.sqlite")
    _alert_run(journal, {**LINKS, "runbook_url": EVIL})
    journal.add_event("started", now=1000.0, model="m1", run_id=1)
    journal.add_event("absorbed", now=1001.0, model="m1", run_id=99)  # a run not shown
    return journal, journal.list_runs()


def test_the_page_shows_http_links_and_a_javascript_url_only_as_text(tmp_path: Path) -> None:
    journal, runs = _runs(tmp_path)
    html = render_page(
        [r.to_dict() for r in runs],
        now=datetime.now(UTC),
        events=[e.to_dict() for e in journal.recent_decisions(None, None, 10)],
    )
    page = _Hrefs()
    page.feed(html)
    assert sorted(page.hrefs) == sorted(["#run-1", GENERATOR, EXTERNAL])
    assert f'<a href="{EXTERNAL}" rel="noopener noreferrer">' in html
    assert "javascript:alert(1) " in html and "(not a link: scheme javascript)" in html
    assert "run-1" in page.ids  # the decision naming run 1 leads to it; run 99 is not here


async def test_the_api_gives_the_links_that_are_links_and_the_others_apart(
    tmp_path: Path, web_config: Any
) -> None:
    journal, _ = _runs(tmp_path)
    app = make_app(FakeEngine(), journal, web_config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        (run,) = (await (await client.get("/api/remediations")).json())["runs"]
    assert run["links"] == {"generator_url": GENERATOR, "external_url": EXTERNAL}
    assert run["unsafe_links"] == {"runbook_url": EVIL}


def test_the_log_shows_each_link_whole_under_its_run_and_says_which_is_no_link(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    long = "https://prometheus.example/graph?g0.expr=" + "x" * 120
    _alert_run(journal, {"runbook_url": "javascript:\x1b[2Jalert(1)", "generator_url": long})
    (run,) = journal.list_runs()
    _header, runbook, alert_line = cli_log.format_run(run, width=80)
    assert (
        runbook == "      runbook:      javascript:\\x1b[2Jalert(1) (not a link: scheme javascript)"
    )
    assert alert_line == f"      alert:        {long}"  # longer than the terminal, never cut
