"""Pauses and open circuits wherever on-call looks: `/metrics`, `/api/remediations` and
the banner on `/`, each read from the journal when asked, so what `mlx-medic pause` and
`resume` write (through their own connection to the journal) shows at once, and so does
a circuit the service opened."""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import (
    DEFAULT_PATH_FOUND_BY,
    FLAG_FOUND_BY,
    ConfigSource,
    resume_command,
)
from mlx_medic.remediator.control_state import Hold, ModelHold, model_holds
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import ControlView
from mlx_medic.remediator.oncall_page import render_page
from mlx_medic.remediator.service import config_source
from mlx_medic.remediator.webapp import make_app
from tests.remediator.engine_fakes import MODEL, OTHER, alert, make_engine
from tests.remediator.test_cli import cli, config_of, write_config

SERIES = (
    "mlx_medic_paused",
    "mlx_medic_paused_since_timestamp_seconds",
    "mlx_medic_circuit_open",
    "mlx_medic_circuit_open_since_timestamp_seconds",
)


class Remediator:
    """The service's app around a real engine, and the config file on-call passes."""

    def __init__(self, client: TestClient, engine: Engine, config_file: Path) -> None:
        self.client, self.engine, self.config_file = client, engine, config_file

    def cli(self, *words: str) -> int:
        """`mlx-medic WORDS --config.file FILE`: its own connection to the journal."""
        return cli([words[0], "--config.file", str(self.config_file), *words[1:]])

    async def series(self) -> dict[tuple[str, str], float]:
        """(name, model) -> value of the pause and circuit series, as scraped."""
        response = await self.client.get("/metrics")
        assert response.status == 200
        return {
            (sample.name, sample.labels["model"]): sample.value
            for family in text_string_to_metric_families(await response.text())
            for sample in family.samples
            if sample.name in SERIES
        }

    async def api(self, query: str = "") -> dict:
        response = await self.client.get(f"/api/remediations{query}")
        assert response.status == 200
        return await response.json()

    async def page(self) -> str:
        response = await self.client.get("/")
        assert response.status == 200
        return await response.text()


async def start(tmp_path: Path, playbook: str = "succeeding") -> AsyncIterator[Remediator]:
    config_file = write_config(tmp_path, routing={"playbooks": {"LLMModelDown": playbook}})
    config = config_of(config_file)
    inventory = parse_inventory(Path(config.inventory).read_text())
    registry = CollectorRegistry()
    engine = make_engine(config, inventory, registry=registry, tmp_path=tmp_path)
    source = ConfigSource(config_file, FLAG_FOUND_BY)
    app = make_app(engine, engine.journal, config, registry, None, source)
    async with TestClient(TestServer(app)) as client:
        yield Remediator(client, engine, config_file)
    await engine.wait_idle()
    await engine.close()


@pytest.fixture
async def remediator(tmp_path: Path) -> AsyncIterator[Remediator]:
    async for service in start(tmp_path):
        yield service


@pytest.fixture
async def escalating(tmp_path: Path) -> AsyncIterator[Remediator]:
    """A service whose playbook escalates: its first run opens the model's circuit."""
    async for service in start(tmp_path, "unrecoverable"):
        yield service


def state(series: dict[tuple[str, str], float], model: str) -> tuple[float, ...]:
    return tuple(series[(name, model)] for name in SERIES)


# --- /metrics ---------------------------------------------------------------------------


async def test_every_known_model_is_neither_paused_nor_open_from_the_start(
    remediator: Remediator,
) -> None:
    series = await remediator.series()
    assert state(series, MODEL) == (0, 0, 0, 0)
    assert state(series, OTHER) == (0, 0, 0, 0)
    assert {model for _, model in series} == {MODEL, OTHER}


async def test_a_pause_from_the_cli_shows_at_the_next_scrape_and_resume_clears_it(
    remediator: Remediator,
) -> None:
    before = time.time()
    assert remediator.cli("pause", MODEL, "--reason", "bob is on ai002") == 0
    series = await remediator.series()
    paused, since, circuit, circuit_since = state(series, MODEL)
    assert (paused, circuit, circuit_since) == (1, 0, 0)
    assert before <= since <= time.time()
    assert state(series, OTHER) == (0, 0, 0, 0)

    assert remediator.cli("resume", MODEL) == 0
    assert state(await remediator.series(), MODEL) == (0, 0, 0, 0)


async def test_the_pause_of_all_models_pauses_each_since_the_older_pause(
    remediator: Remediator,
) -> None:
    assert remediator.cli("pause", MODEL) == 0
    own = (await remediator.series())[("mlx_medic_paused_since_timestamp_seconds", MODEL)]
    assert remediator.cli("pause") == 0
    series = await remediator.series()
    assert series[("mlx_medic_paused", MODEL)] == series[("mlx_medic_paused", OTHER)] == 1
    assert series[("mlx_medic_paused_since_timestamp_seconds", MODEL)] == own
    assert series[("mlx_medic_paused_since_timestamp_seconds", OTHER)] > own

    assert remediator.cli("resume") == 0  # the pause of all models only
    series = await remediator.series()
    assert state(series, MODEL)[:2] == (1, own)
    assert state(series, OTHER) == (0, 0, 0, 0)


async def test_a_circuit_the_service_opens_shows_and_resume_of_the_model_closes_it(
    escalating: Remediator,
) -> None:
    assert await escalating.engine.submit(alert("bad1")) == Disposition.STARTED
    await escalating.engine.wait_idle()
    [circuit] = escalating.engine.journal.controls()
    series = await escalating.series()
    assert state(series, MODEL) == (0, 0, 1, circuit.since)

    assert escalating.cli("resume", MODEL) == 0
    assert state(await escalating.series(), MODEL) == (0, 0, 0, 0)


def test_a_control_of_a_name_the_inventory_lacks_holds_no_model_back() -> None:
    controls = [
        ControlView("pause", "typo", "", None, "bob", 5.0),
        ControlView("circuit", "m1", "budget_spent: x", "reboot", "remediator@h", 7.0),
    ]
    assert model_holds(controls, ["m1", "m2"]) == {
        "m1": ModelHold(paused_since=None, circuit_since=7.0),
        "m2": ModelHold(),
    }


# --- /api/remediations ------------------------------------------------------------------


async def test_the_api_lists_pauses_with_scope_reason_who_since_and_the_resume_command(
    remediator: Remediator,
) -> None:
    assert remediator.cli("pause", "--reason", "maintenance") == 0
    assert remediator.cli("pause", MODEL, "--reason", "bob is on ai002") == 0
    body = await remediator.api()
    assert set(body) == {"journal_problem", "runs", "decisions", "pauses", "circuits"}
    assert body["journal_problem"] is None  # the journal records
    everyone, own = body["pauses"]  # oldest first
    flag = f"--config.file {remediator.config_file}"
    assert everyone["model"] is None and everyone["reason"] == "maintenance"
    assert everyone["resume"] == f"mlx-medic resume {flag}"
    assert own["model"] == MODEL and own["reason"] == "bob is on ai002"
    assert own["resume"] == f"mlx-medic resume {MODEL} {flag}"
    assert own["by_whom"] and own["kind"] == "pause" and own["since"] >= everyone["since"]
    assert body["circuits"] == []

    other = await remediator.api(f"?model={OTHER}")  # only what holds OTHER back
    assert [p["model"] for p in other["pauses"]] == [None]


async def test_the_api_names_the_run_that_opened_a_circuit(escalating: Remediator) -> None:
    await escalating.engine.submit(alert("bad1"))
    await escalating.engine.wait_idle()
    body = await escalating.api()
    [run] = body["runs"]
    [circuit] = body["circuits"]
    assert run["outcome"] == "escalated"
    assert circuit["model"] == MODEL and circuit["run_id"] == run["id"]
    assert circuit["reason"].startswith("unrecoverable: ") and circuit["next_action"]
    assert circuit["resume"] == f"mlx-medic resume {MODEL} --config.file {escalating.config_file}"
    assert body["pauses"] == []


async def test_the_api_decisions_carry_paused_stale_and_unknown_model(
    remediator: Remediator,
) -> None:
    engine = remediator.engine
    assert remediator.cli("pause", MODEL) == 0
    assert await engine.submit(alert("p1")) == Disposition.PAUSED
    assert await engine.submit(alert("u1", model="nope")) == Disposition.UNKNOWN_MODEL
    old = datetime.fromtimestamp(time.time() - 7 * 3600, UTC)
    assert await engine.submit(alert("s1", OTHER, starts_at=old)) == Disposition.STALE
    decisions = (await remediator.api())["decisions"]
    kinds = {d["fingerprint"]: d["kind"] for d in decisions if d["fingerprint"]}
    assert kinds == {"p1": "paused", "u1": "unknown_model", "s1": "stale"}


# --- the banner on / --------------------------------------------------------------------


async def test_the_page_has_no_banner_while_nothing_is_held_back(remediator: Remediator) -> None:
    assert 'class="hold"' not in await remediator.page()


async def test_the_banner_names_what_since_when_why_and_the_command_that_lifts_it(
    remediator: Remediator,
) -> None:
    assert remediator.cli("pause", "--reason", "migrating <b>ai002</b> & ai003") == 0
    [pause] = remediator.engine.journal.controls()
    html = await remediator.page()
    banner = html[html.index('<section class="hold"') : html.index("</section>")]
    assert "Automatic remediation is held back" in banner
    since = datetime.fromtimestamp(pause.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"since {since}" in banner
    assert "all models" in banner
    assert "migrating &lt;b&gt;ai002&lt;/b&gt; &amp; ai003" in banner and "<b>ai002" not in html
    assert f"<code>mlx-medic resume --config.file {remediator.config_file}</code>" in banner
    assert html.index('class="hold"') < html.index("No remediations recorded")


async def test_the_banner_names_an_open_circuit_its_run_and_next_action(
    escalating: Remediator,
) -> None:
    await escalating.engine.submit(alert("bad1"))
    await escalating.engine.wait_idle()
    html = await escalating.page()
    banner = html[html.index('<section class="hold"') : html.index("</section>")]
    assert f'Circuit open: <span class="model">{MODEL}</span>' in banner
    assert "opened by run #1" in banner and "Next: " in banner
    assert f"<code>mlx-medic resume {MODEL} --config.file" in banner


def test_every_banner_value_is_escaped() -> None:
    evil = "<script>alert(1)</script>\"'><img src=x>"
    control = ControlView("circuit", evil, evil, evil, evil, 0.0)
    html = render_page(
        [], now=datetime.now(UTC), holds=[Hold(control, 3, f"mlx-medic resume {evil}")]
    )
    assert "<script>" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 5


# --- the resume command names the service's config -------------------------------------


def test_the_service_names_its_config_by_absolute_path_and_the_default_path_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    given = config_source(argparse.Namespace(config_file=Path("remediator.yml")))
    assert given == ConfigSource(tmp_path / "remediator.yml", FLAG_FOUND_BY)

    assert resume_command(given, "m1") == f"mlx-medic resume m1 --config.file {given.path}"
    default = ConfigSource(Path("/etc/mlx-medic/remediator.yml"), DEFAULT_PATH_FOUND_BY)
    assert resume_command(default, None) == "mlx-medic resume"
    assert resume_command(None, "m1") == "mlx-medic resume m1"
