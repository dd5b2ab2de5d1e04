"""`mlx-medic log --journal A --journal B`: one incident from both replicas' journals.

Two replicas receive the same alert; the model lock on the head lets one act, the
other's run ends `locked` naming its peer as the holder. Read together, on-call sees
both runs newest first, each with its replica, and which one acted."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from mlx_medic.remediator import cli_log
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.log_replicas import open_journals
from mlx_medic.remediator.outcomes import RunOutcome
from tests.remediator.engine_fakes import MODEL
from tests.remediator.test_cli import cli

T = 1796331929.0  # 2026-12-03T21:05:29Z
FINGERPRINT = "5f0c1e2d3a4b6c7d"
LOCKED_DETAIL = (
    "the model lock on ai001: locked by mlx-medic-remediator (run 1, pid 4242 on ra,"
    " since 21:05:29Z)"
)


def alert_run(journal: Journal, owner: str, at: float) -> int:
    """The run the alert starts on a replica, as the engine journals it."""
    run_id = journal.create_alert_run(
        model=MODEL,
        playbook="recover",
        owner=owner,
        now=at,
        alertname="LLMModelDown",
        fingerprint=FINGERPRINT,
        starts_at="2026-12-03T21:04:00Z",
        labels={"model": MODEL, "severity": "page"},
        dry_run=False,
    )
    assert run_id is not None
    journal.add_event(
        Disposition.STARTED, now=at, model=MODEL, fingerprint=FINGERPRINT, run_id=run_id
    )
    return run_id


def acted(path: Path, host: str = "ra") -> Journal:
    """A replica whose run took the lock and recovered the model."""
    journal = Journal(path)
    run_id = alert_run(journal, f"{host}:4242", T)
    journal.start_run(run_id, T + 1)
    journal.end_run(run_id, RunOutcome.SUCCEEDED, T + 60, f"{MODEL} verified healthy on ring")
    return journal


def locked_out(path: Path, host: str = "rb") -> Journal:
    """Its peer: the same alert a second later; the lock was held, so it did nothing."""
    journal = Journal(path)
    run_id = alert_run(journal, f"{host}:5151", T + 1)
    journal.end_run(run_id, RunOutcome.LOCKED, T + 2, LOCKED_DETAIL)
    journal.set_pause(MODEL, reason="watching the recovery", by_whom="alice@rb", now=T + 3)
    return journal


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a" / "journal.sqlite", tmp_path / "b" / "journal.sqlite"
    acted(a).close()
    locked_out(b).close()
    return a, b


def test_both_replicas_runs_are_shown_newest_first_named_by_replica_and_run(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    assert cli(["log", "--journal", str(a), "--journal", str(b)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    locked = next(i for i, line in enumerate(lines) if line.startswith("rb#1 "))
    succeeded = next(i for i, line in enumerate(lines) if line.startswith("ra#1 "))
    assert locked < succeeded  # newest first, across the journals
    assert "locked" in lines[locked] and "succeeded" in lines[succeeded]
    assert " ".join(captured.out.split()).count(f"why: {LOCKED_DETAIL}") == 1  # whole
    # the decisions of both, each with its replica and the run it names
    assert any(line.split()[1:3] == ["rb", "started"] and "run rb#1" in line for line in lines)
    assert any(line.split()[1:3] == ["ra", "started"] and "run ra#1" in line for line in lines)
    # a pause says whose journal holds it, and where its undo is run
    assert lines[0].startswith(f"PAUSED: {MODEL} since 2026-12-03T21:05:32Z by alice@rb,")
    assert "held by replica rb" in captured.out
    assert f"undo: `mlx-medic resume {MODEL}` on rb" in captured.out
    assert f"mlx-medic: journal {a} (replica ra), read-only" in captured.err


def test_json_gives_every_run_decision_and_control_its_journal_and_replica(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    assert cli(["log", "--journal", str(a), "--journal", str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    runs = [(r["replica"], r["journal"], r["id"], r["outcome"]) for r in data["runs"]]
    assert runs == [("rb", str(b), 1, "locked"), ("ra", str(a), 1, "succeeded")]
    assert data["runs"][0]["detail"] == LOCKED_DETAIL
    events = [(e["replica"], e["journal"], e["kind"]) for e in data["events"]]
    assert events == [("rb", str(b), "started"), ("ra", str(a), "started")]
    assert [(c["replica"], c["kind"]) for c in data["controls"]] == [("rb", "pause")]


def test_journals_of_the_same_host_are_told_apart_by_their_file_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = tmp_path / "one.sqlite", tmp_path / "two.sqlite"
    acted(one, host="h").close()
    locked_out(two, host="h").close()
    assert cli(["log", "--journal", str(one), "--journal", str(two)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("two.sqlite#1 ") and "locked" in line for line in lines)
    assert any(line.startswith("one.sqlite#1 ") and "succeeded" in line for line in lines)


def test_follow_polls_every_journal(pair: tuple[Path, Path]) -> None:
    out = io.StringIO()
    replicas = open_journals(list(pair))
    cli_log.follow(replicas, None, None, 20, as_json=True, out=out, rounds=1, sleep=lambda _: 0)
    for replica in replicas:
        replica.journal.close()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {(r["record"], r["replica"]) for r in records} == {
        ("run", "ra"),
        ("run", "rb"),
        ("decision", "ra"),
        ("decision", "rb"),
    }


def test_a_missing_or_unreadable_journal_is_refused_naming_it_and_nothing_is_created(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = pair
    missing = tmp_path / "c" / "journal.sqlite"
    assert cli(["log", "--journal", str(a), "--journal", str(missing)]) == 2
    assert f"--journal {missing}: cannot read it: No such file or directory" in (
        capsys.readouterr().err
    )
    assert not missing.parent.exists()
    not_a_journal = tmp_path / "notes.txt"
    not_a_journal.write_text("not a journal\n")
    assert cli(["log", "--journal", str(not_a_journal)]) == 2
    assert f"--journal {not_a_journal}: cannot read it as a journal" in capsys.readouterr().err
    assert cli(["log", "--journal", str(a), "--journal", str(a)]) == 2
    assert f"--journal {a} is given twice" in capsys.readouterr().err


def fingerprint_of(path: Path) -> tuple[int, str, list[str]]:
    """The file's mtime, its bytes' hash, and what its directory holds."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return os.stat(path).st_mtime_ns, digest, sorted(os.listdir(path.parent))


def test_reading_modifies_no_journal_in_use_or_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a" / "journal.sqlite", tmp_path / "b" / "journal.sqlite"
    in_use = acted(a)  # its service still has it open: its -wal and -shm are there
    locked_out(b).close()  # no process has it open: no -wal, and reading makes none
    before = [fingerprint_of(a), fingerprint_of(b)]
    try:
        for extra in ([], ["--json"]):
            assert cli(["log", "--journal", str(a), "--journal", str(b), *extra]) == 0
        assert [fingerprint_of(a), fingerprint_of(b)] == before
        assert "ra#1" in capsys.readouterr().out
    finally:
        in_use.close()
