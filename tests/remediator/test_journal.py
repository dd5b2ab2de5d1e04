"""The journal: what on-call and the next process can rely on finding."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from mlx_medic.remediator.journal import OUTPUT_CAP, Journal, StepView, owner_tag, schema
from mlx_medic.remediator.outcomes import RUN_ENDED, RUN_HOLDS_FIRING, RunOutcome, StepOutcome
from tests.remediator.engine_fakes import dead_pid


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "deep" / "dir" / "journal.sqlite")


def _run(journal: Journal, model: str = "m1", now: float = 1000.0, owner: str | None = None) -> int:
    return journal.create_run(
        model=model,
        playbook="recover",
        trigger_kind="manual",
        owner=owner or owner_tag("host-a", os.getpid()),
        now=now,
    )


def test_the_journal_creates_its_directory_and_uses_wal_mode(journal: Journal) -> None:
    assert journal.path.exists()
    mode = sqlite3.connect(journal.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_commits_are_synchronous_full_so_a_power_cut_keeps_them(journal: Journal) -> None:
    assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_the_journal_its_wal_and_shm_are_0640_whatever_the_umask(
    tmp_path: Path,
    umask: int,
) -> None:
    old = os.umask(umask)
    try:
        journal = Journal(tmp_path / "state" / "journal.sqlite")
        _run(journal)
        files = [journal.path, Path(f"{journal.path}-wal"), Path(f"{journal.path}-shm")]
        assert {oct(f.stat().st_mode & 0o7777) for f in files} == {oct(0o640)}
        journal.close()
    finally:
        os.umask(old)


def test_a_journal_an_older_version_left_world_readable_is_narrowed_on_open(
    tmp_path: Path,
) -> None:
    Journal(tmp_path / "journal.sqlite").close()
    (tmp_path / "journal.sqlite").chmod(0o644)
    journal = Journal(tmp_path / "journal.sqlite")
    assert (journal.path.stat().st_mode & 0o7777) == 0o640
    assert journal.list_runs() == []


def test_a_step_is_visible_to_another_process_as_running_before_it_ends(
    journal: Journal,
) -> None:
    run_id = _run(journal)
    journal.start_run(run_id, 1001.0)
    journal.begin_step(
        run_id,
        seq=1,
        name="sweep",
        node="ai002",
        command=["kill", "-9", "42"],
        description="kill ranks",
        targets=["42"],
        now=1002.0,
    )
    other = Journal(journal.path)  # a second connection, as `mlx-medic log` would open
    (run,) = other.list_runs()
    assert run.outcome == "running"
    assert [(s.name, s.node, s.outcome, s.command) for s in run.steps] == [
        ("sweep", "ai002", "running", ["kill", "-9", "42"])
    ]


def test_runs_come_newest_first_with_their_steps_in_order_and_filter_by_model_and_time(
    journal: Journal,
) -> None:
    first, second, third = (
        _run(journal, "m1", 100.0),
        _run(journal, "m2", 200.0),
        _run(journal, "m1", 300.0),
    )
    for seq in (1, 2, 3):
        step = journal.begin_step(
            second,
            seq=seq,
            name=f"s{seq}",
            node="n",
            command=None,
            description="d",
            targets=[],
            now=200.0 + seq,
        )
        journal.end_step(step, StepOutcome.OK, 200.5 + seq)
    assert [r.id for r in journal.list_runs()] == [third, second, first]
    assert [s.name for s in journal.list_runs(model="m2")[0].steps] == ["s1", "s2", "s3"]
    assert [r.id for r in journal.list_runs(model="m1")] == [third, first]
    assert [r.id for r in journal.list_runs(since=150.0)] == [third, second]
    assert [r.id for r in journal.list_runs(limit=1)] == [third]
    json.dumps([r.to_dict() for r in journal.list_runs()])  # JSON-ready as it is


def test_a_run_records_its_trigger_command_targets_output_duration_and_outcome(
    journal: Journal,
) -> None:
    run_id = journal.create_run(
        model="m1",
        playbook="recover",
        trigger_kind="alert",
        owner="h:1",
        now=10.0,
        alertname="LLMModelDown",
        fingerprint="abc",
        starts_at="2026-01-01T00:00:00+00:00",
        labels={"model": "m1", "severity": "critical"},
    )
    journal.start_run(run_id, 11.0)
    step = journal.begin_step(
        run_id,
        seq=1,
        name="stop-service",
        node="ai001",
        command=["launchctl", "bootout", "system/x"],
        description="stop",
        targets=["x"],
        now=12.0,
    )
    journal.end_step(
        step, StepOutcome.FAILED, 14.5, exit_status=3, output="x" * (OUTPUT_CAP * 3), detail="boom"
    )
    journal.end_run(run_id, RunOutcome.ESCALATED, 15.0, "stop failed", "reboot ai001")
    run = journal.get_run(run_id)
    assert run is not None
    assert (run.trigger, run.labels["severity"], run.duration) == ("alert abc", "critical", 4.0)
    assert (run.outcome, run.detail) == ("escalated", "stop failed")
    assert run.next_action == "reboot ai001"
    (s,) = run.steps
    assert (s.targets, s.exit_status, s.duration, s.detail) == (["x"], 3, 2.5, "boom")
    assert len(s.output) < OUTPUT_CAP + 100 and "[... output cut ...]" in s.output


def test_unknown_outcomes_are_refused_with_the_allowed_list(journal: Journal) -> None:
    run_id = _run(journal)
    with pytest.raises(ValueError, match="expected one of"):
        journal.end_run(run_id, "fine", 1.0)  # type: ignore[arg-type]


def test_start_up_marks_runs_of_dead_processes_of_this_host_interrupted_and_no_others(
    journal: Journal,
) -> None:
    dead = _run(journal, owner=owner_tag("host-a", dead_pid()))
    journal.start_run(dead, 1.0)
    journal.begin_step(
        dead, seq=1, name="sweep", node="ai002", command=None, description="", targets=[], now=2.0
    )
    alive = _run(journal, owner=owner_tag("host-a", os.getpid()))
    elsewhere = _run(journal, owner=owner_tag("host-b", dead_pid()))
    assert journal.mark_interrupted(now=5.0, hostname="host-a") == [dead]
    run = journal.get_run(dead)
    assert run is not None and run.outcome == "interrupted"
    assert [s.outcome for s in run.steps] == ["interrupted"]
    assert journal.get_run(alive).outcome == "queued"  # type: ignore[union-attr]
    assert journal.get_run(elsewhere).outcome == "queued"  # type: ignore[union-attr]


def test_a_firing_is_recorded_once_even_across_journal_instances(journal: Journal) -> None:
    kwargs = dict(
        model="m1",
        playbook="recover",
        owner="h:1",
        now=1.0,
        alertname="A",
        fingerprint="fp",
        starts_at="t0",
        labels={},
        dry_run=False,
    )
    assert journal.create_alert_run(**kwargs) is not None  # type: ignore[arg-type]
    assert Journal(journal.path).create_alert_run(**kwargs) is None  # type: ignore[arg-type]
    assert journal.firing_seen("fp", "t0") and not journal.firing_seen("fp", "t1")


def _alert_run(journal: Journal, fingerprint: str) -> int:
    run_id = journal.create_alert_run(
        model="m1",
        playbook="recover",
        owner=owner_tag("host-a", dead_pid()),
        now=1.0,
        alertname="A",
        fingerprint=fingerprint,
        starts_at="t0",
        labels={},
        dry_run=False,
    )
    assert run_id is not None
    return run_id


@pytest.mark.parametrize("outcome", [RunOutcome.SUCCEEDED, RunOutcome.PLANNED])
def test_a_run_that_succeeded_keeps_holding_its_firings(journal: Journal, outcome: str) -> None:
    run_id = _alert_run(journal, "fp")
    journal.record_firing("absorbed", "t0", "m1", run_id, 2.0)
    journal.end_run(run_id, RunOutcome(outcome), 3.0)
    assert Journal(journal.path).firing_seen("fp", "t0")
    assert Journal(journal.path).firing_seen("absorbed", "t0")


@pytest.mark.parametrize("outcome", sorted(set(RUN_ENDED) - set(RUN_HOLDS_FIRING)))
def test_any_other_run_ending_lets_go_of_its_firings(journal: Journal, outcome: str) -> None:
    run_id = _alert_run(journal, "fp")
    journal.record_firing("absorbed", "t0", "m1", run_id, 2.0, defer=True)  # still pending
    other = _alert_run(journal, "someone-else")
    journal.end_run(run_id, RunOutcome(outcome), 3.0)
    reader = Journal(journal.path)
    assert not reader.firing_seen("fp", "t0") and not reader.firing_seen("absorbed", "t0")
    assert reader.firing_seen("someone-else", "t0") and other


def test_a_run_found_interrupted_at_start_up_lets_go_of_its_firings(journal: Journal) -> None:
    run_id = _alert_run(journal, "fp")
    assert journal.mark_interrupted(now=5.0, hostname="host-a") == [run_id]
    assert not Journal(journal.path).firing_seen("fp", "t0")


def test_pause_and_circuit_are_shared_through_the_file_and_resume_resets_the_budget(
    journal: Journal,
) -> None:
    cli = Journal(journal.path)
    assert cli.set_pause("m1", reason="maintenance", by_whom="me@here", now=1.0)
    assert not cli.set_pause("m1", reason="again", by_whom="me@here", now=2.0)
    control = journal.blocking_control("m1")
    assert control is not None and (control.kind, control.reason) == ("pause", "maintenance")
    assert journal.blocking_control("m2") is None
    cli.set_pause(None, reason="big red button", by_whom="me@here", now=3.0)
    assert journal.blocking_control("m2") is not None
    assert cli.clear_pause(None) and cli.clear_pause("m1")
    assert journal.blocking_control("m1") is None

    assert journal.open_circuit("m1", reason="budget", next_action="reboot", by_whom="r", now=4.0)
    assert not journal.open_circuit("m1", reason="later", next_action="x", by_whom="r", now=5.0)
    assert cli.blocking_control("m1").next_action == "reboot"  # type: ignore[union-attr]
    assert cli.close_circuit("m1", now=6.0)
    assert journal.blocking_control("m1") is None and journal.budget_reset_time("m1") == 6.0


def test_events_are_listed_newest_first_and_filter_by_model_and_kind(journal: Journal) -> None:
    journal.add_event("duplicate", now=1.0, model="m1", fingerprint="a")
    journal.add_event("unknown_model", now=2.0, detail="label model='x' names no model")
    journal.add_event("absorbed", now=3.0, model="m1", run_id=4)
    assert [e.kind for e in journal.list_events()] == ["absorbed", "unknown_model", "duplicate"]
    assert [e.kind for e in journal.list_events(model="m1", kind="duplicate")] == ["duplicate"]
    assert [e.kind for e in journal.list_events(since=2.0, limit=1)] == ["absorbed"]
    json.dumps([e.to_dict() for e in journal.list_events()])


def test_threads_can_write_through_one_journal_at_once(journal: Journal) -> None:
    def write(i: int) -> None:
        for j in range(20):
            journal.add_event("duplicate", now=float(i * 100 + j), model="m1")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(journal.list_events(limit=1000)) == 160


def test_deferred_events_are_read_at_once_here_and_reach_the_file_on_flush(
    journal: Journal,
) -> None:
    journal.add_event("duplicate", now=1.0, model="m1", defer=True)
    journal.record_firing("fp", "t0", "m1", None, 1.0, defer=True)
    other = Journal(journal.path)  # another process, e.g. `mlx-medic log`
    assert other.list_events() == [] and not other.firing_seen("fp", "t0")
    assert journal.firing_seen("fp", "t0")  # this process sees its own pending firing
    assert [e.kind for e in journal.list_events()] == ["duplicate"]  # a read flushes
    assert [e.kind for e in other.list_events()] == ["duplicate"]
    assert other.firing_seen("fp", "t0") and journal.pending == 0


def test_a_journal_an_older_version_wrote_gets_the_new_columns_once_and_reads_as_before(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the tables as a version before ADDED_COLUMNS made them
        db.executescript(schema.SCHEMA)
        db.execute(
            "INSERT INTO runs (model, playbook, trigger_kind, owner, outcome, queued_at)"
            " VALUES ('m1', 'recover', 'manual', 'h:1', 'succeeded', 1.0)"
        )
    db.close()
    (old,) = Journal(path).list_runs()
    assert old.recheck is None and old.outcome == "succeeded"
    reopened = Journal(path)  # the columns are there now: nothing to add, no error
    reopened.record_recheck(old.id, "no re-check: started by hand")
    (run,) = reopened.list_runs()
    assert run.recheck == "no re-check: started by hand"
    with sqlite3.connect(path) as db:
        for table, column, _type in schema.ADDED_COLUMNS:
            have = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            assert have.count(column) == 1
    db.close()


def test_a_planned_step_has_no_duration_even_as_an_older_journal_ended_it_at_its_start() -> None:
    old = StepView(1, 1, 1, "verify", "ai001", None, "", [], "planned", None, "", "", 3.0, 3.0)
    assert old.duration is None and old.to_dict()["duration_seconds"] is None
