"""A node's drain in the journal (`mlx-medic drain` / `undrain`): the newest drain or undrain
event of a node says whether it is drained, the series the drain alert reads, and the
refusals that change nothing. The whole drain, reboot and undrain on real nodes:
tests/serve/test_drain_reboot.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.remediator.drain import (
    DRAIN_EVENT,
    UNDRAIN_EVENT,
    DrainRecord,
    open_drains,
    undrain_detail,
)
from mlx_medic.remediator.engine_metrics import ControlMetrics
from mlx_medic.remediator.journal import Journal
from tests.remediator.test_cli import cli, config_of, write_config


def record(node: str = "ai002", **changes: object) -> DrainRecord:
    fields: dict[str, object] = {
        "node": node,
        "boot_id": "boot-1",
        "models": ("glm", "qwq"),
        "by": "alice@host",
        "since": 1000.0,
        "silences": ("s1", "s2"),
        "alertmanager": "http://127.0.0.1:9093",
    }
    fields.update(changes)
    return DrainRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture
def journal(tmp_path: Path):
    opened = Journal(tmp_path / "journal.sqlite")
    yield opened
    opened.close()


def test_a_drain_event_carries_its_whole_record_after_a_sentence_for_people():
    drained = record(not_stopped=("qwq",))
    detail = drained.to_detail()
    assert detail.startswith(
        "ai002 drained by alice@host (boot boot-1): paused and stopped glm, qwq;"
        " NOT stopped: qwq; silences s1, s2."
    )
    assert DrainRecord.parse(detail) == drained
    with pytest.raises(ValueError, match="no drain record"):
        DrainRecord.parse("ai002 drained by hand")


def test_a_node_is_drained_until_an_undrain_event_names_it(journal: Journal):
    journal.add_event(DRAIN_EVENT, now=1000.0, detail=record("ai002").to_detail())
    journal.add_event(DRAIN_EVENT, now=1001.0, detail=record("ai003", since=1001.0).to_detail())
    journal.add_event(DRAIN_EVENT, now=1002.0, detail="ai004 drained, written by hand")
    assert sorted(open_drains(journal)) == ["ai002", "ai003"]
    journal.add_event(UNDRAIN_EVENT, now=1003.0, detail=undrain_detail("ai002", "glm back"))
    assert list(open_drains(journal)) == ["ai003"]
    journal.add_event(DRAIN_EVENT, now=1004.0, detail=record("ai002", since=1004.0).to_detail())
    assert open_drains(journal)["ai002"].since == 1004.0  # drained again, after the undrain


def test_the_drain_series_is_its_start_per_node_and_0_for_a_node_not_drained(journal: Journal):
    journal.add_event(DRAIN_EVENT, now=1000.0, detail=record("ai002").to_detail())
    registry = CollectorRegistry()
    registry.register(ControlMetrics(journal, ["glm"], ["ai001", "ai002"]))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert 'mlx_medic_node_drained_since_timestamp_seconds{node="ai001"} 0.0' in text
    assert 'mlx_medic_node_drained_since_timestamp_seconds{node="ai002"} 1000.0' in text


def test_drain_and_undrain_of_a_node_the_inventory_lacks_are_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config = write_config(tmp_path)
    for command in ("drain", "undrain"):
        assert cli([command, "ai009", "--config.file", str(config)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"mlx-medic {command}: no node 'ai009'" in err and "known: ai001" in err


def test_undrain_of_a_node_not_drained_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config = write_config(tmp_path)
    assert cli(["undrain", "ai002", "--config.file", str(config)]) == EXIT_USAGE
    assert "ai002 is not drained; nothing to undo" in capsys.readouterr().err


def test_a_second_drain_and_a_silence_without_alertmanager_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config = write_config(tmp_path)
    args = ["drain", "ai002", "--yes", "--config.file", str(config)]
    assert cli([*args, "--silence"]) == EXIT_USAGE
    assert "--silence needs --alertmanager.url" in capsys.readouterr().err
    journal = Journal(config_of(config).journal)
    journal.add_event(DRAIN_EVENT, now=time.time(), detail=record("ai002").to_detail())
    journal.close()
    assert cli(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "ai002 is drained already (by alice@host, boot boot-1)" in err
    assert "mlx-medic undrain ai002" in err
