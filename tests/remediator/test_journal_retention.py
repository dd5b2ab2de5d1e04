"""The journal's bound (remediator/journal/retention.py): what a prune deletes, oldest
first, and what it never deletes, whatever its age or the journal's size."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.budget import Budget
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.journal import retention as retention_module
from mlx_medic.remediator.journal.retention import Retention, journal_bytes, prune
from mlx_medic.remediator.outcomes import RunOutcome, StepOutcome
from tests.remediator.engine_fakes import MODEL, make_inventory

DAY = 86400.0
NOW = 100 * DAY
NO_SIZE_BOUND = 1 << 40


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.sqlite")


def ended_run(journal: Journal, at: float, *, counted: bool = False) -> int:
    """A run that started at `at`, acted (one step, one firing) and ended a minute later."""
    run_id = journal.create_alert_run(
        model=MODEL,
        playbook="recover",
        owner="h:1",
        now=at,
        alertname="LLMModelDown",
        fingerprint=f"fp{at}",
        starts_at=f"{at}",
        labels={},
        dry_run=False,
    )
    assert run_id is not None
    journal.start_run(run_id, at)
    step = journal.begin_step(
        run_id, seq=1, name="sweep", node="n1", command=None, description="", targets=[], now=at
    )
    journal.end_step(step, StepOutcome.OK, now=at + 30)
    if counted:
        journal.mark_counted(run_id)
    journal.end_run(run_id, RunOutcome.SUCCEEDED, now=at + 60)
    return run_id


def table_count(journal: Journal, table: str) -> int:
    journal.flush()
    return int(journal._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def run_ids(journal: Journal) -> set[int]:
    return {run.id for run in journal.list_runs(limit=1000)}


def bounds(max_age: float, *, keep: float = 0.0, max_bytes: int = NO_SIZE_BOUND) -> Retention:
    return Retention(max_age=max_age, max_bytes=max_bytes, keep=keep)


def test_runs_with_their_steps_and_firings_and_events_older_than_max_age_go(
    journal: Journal,
) -> None:
    old, new = ended_run(journal, NOW - 40 * DAY), ended_run(journal, NOW - 10 * DAY)
    journal.add_event("started", now=NOW - 40 * DAY, model=MODEL)
    journal.add_event("started", now=NOW - 10 * DAY, model=MODEL)

    result = prune(journal.path, bounds(30 * DAY), now=NOW)

    assert result.rows() == {"runs": 1, "steps": 1, "firings": 1, "events": 1}
    assert run_ids(journal) == {new}
    assert journal.get_run(old) is None
    assert [e.time for e in journal.list_events()] == [NOW - 10 * DAY]
    assert table_count(journal, "steps") == table_count(journal, "firings") == 1


def test_runs_of_the_last_keep_days_stay_even_past_max_age_but_their_events_go(
    journal: Journal,
) -> None:
    kept = ended_run(journal, NOW - 3 * DAY)
    gone = ended_run(journal, NOW - 8 * DAY)
    journal.add_event("started", now=NOW - 3 * DAY, model=MODEL)

    prune(journal.path, bounds(1 * DAY, keep=7 * DAY), now=NOW)

    assert run_ids(journal) == {kept}
    assert gone not in run_ids(journal)
    assert journal.list_events() == []


def test_a_run_not_ended_stays_however_old(journal: Journal) -> None:
    queued = journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="manual", owner="h:1", now=NOW - 90 * DAY
    )
    prune(journal.path, bounds(1 * DAY), now=NOW)
    assert run_ids(journal) == {queued}


def test_over_max_bytes_the_oldest_events_go_until_it_fits_and_the_file_shrinks(
    journal: Journal,
) -> None:
    for i in range(20_000):  # about 3 MB, each event a minute newer
        journal.add_event(
            "absorbed", now=NOW - DAY + 60 * i, model=MODEL, detail="x" * 100, defer=True
        )
    journal.flush()
    before = journal_bytes(journal.path)

    result = prune(journal.path, bounds(30 * DAY, max_bytes=1 << 20), now=NOW + 30 * DAY)

    assert 0 < result.events < 20_000
    assert result.bytes_after < before and result.bytes_after <= (1 << 20) + 64 * 1024
    times = [e.time for e in journal.list_events(limit=20_000)]
    assert max(times) == NOW - DAY + 60 * 19_999  # the newest stay
    assert min(times) == NOW - DAY + 60 * result.events  # the oldest went, in order


def test_a_pause_an_open_circuit_and_a_budget_reset_older_than_max_age_stay(
    journal: Journal,
) -> None:
    long_ago = NOW - 365 * DAY
    journal.set_pause(None, reason="maintenance", by_whom="ann@h", now=long_ago)
    journal.open_circuit(MODEL, reason="spent", next_action="look", by_whom="r@h", now=long_ago)
    journal.close_circuit("other", now=long_ago)

    prune(journal.path, bounds(1 * DAY, max_bytes=1 << 20), now=NOW)

    assert {(c.kind, c.model) for c in journal.controls()} == {("pause", None), ("circuit", MODEL)}
    assert journal.budget_reset_time("other") == long_ago


def test_the_newest_of_a_decision_that_needs_a_person_stays_and_its_older_repeats_go(
    journal: Journal,
) -> None:
    for day in (90, 80, 70):
        journal.add_event(Disposition.UNKNOWN_MODEL, now=NOW - day * DAY, model="ghost")
        journal.add_event(Disposition.ABSORBED, now=NOW - day * DAY, model=MODEL)

    result = prune(journal.path, bounds(30 * DAY), now=NOW)

    assert result.events == 5
    (left,) = journal.list_events()
    assert (left.kind, left.model, left.time) == (
        Disposition.UNKNOWN_MODEL,
        "ghost",
        NOW - 70 * DAY,
    )
    assert [d.kind for d in journal.recent_decisions()] == [Disposition.UNKNOWN_MODEL]


def test_runs_the_budget_window_counts_stay_so_the_budgets_verdict_is_the_same(
    journal: Journal,
) -> None:
    model = make_inventory(restart_budget=5, window="2d", backoff="1h").model(MODEL)
    for hours in (40, 30, 20):
        ended_run(journal, NOW - hours * 3600, counted=True)
    budget = Budget(journal, lambda: NOW)
    verdict = budget.check(model)

    window = Retention(max_age=3600, max_bytes=1 << 20, keep=0, budget_window=model.policy.window)
    prune(journal.path, window, now=NOW)

    assert budget.check(model) == verdict
    assert verdict.runs_in_window == 3


def test_a_dry_run_deletes_nothing_and_counts_what_a_prune_would(journal: Journal) -> None:
    ended_run(journal, NOW - 40 * DAY)
    journal.add_event("started", now=NOW - 40 * DAY, model=MODEL)

    dry = prune(journal.path, bounds(30 * DAY), now=NOW, dry_run=True)

    assert dry.dry_run and dry.summary().startswith(
        "would delete 1 runs, 1 steps, 1 firings, 1 events"
    )
    assert len(run_ids(journal)) == 1 and len(journal.list_events()) == 1
    real = prune(journal.path, bounds(30 * DAY), now=NOW)
    assert real.rows() == dry.rows()


def test_a_prune_that_fails_midway_deletes_nothing(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended_run(journal, NOW - 40 * DAY)
    journal.add_event("started", now=NOW - 40 * DAY, model=MODEL)
    journal.add_event("started", now=NOW - 5 * DAY, model=MODEL)  # the size bound's to go

    def fail_after_the_first(*args: object) -> dict[str, int]:
        monkeypatch.setattr(retention_module, "_delete_through", broken)
        return real(*args)

    def broken(*args: object) -> dict[str, int]:
        raise sqlite3.OperationalError("disk I/O error")

    real = retention_module._delete_through
    monkeypatch.setattr(retention_module, "_delete_through", fail_after_the_first)
    with pytest.raises(sqlite3.OperationalError):
        prune(journal.path, bounds(30 * DAY, max_bytes=0), now=NOW)

    assert len(run_ids(journal)) == 1 and len(journal.list_events()) == 2
