"""Bounding the journal: what a prune deletes, what it never does, and the space it gives
back. An alert flood writes tens of MB of events; without a bound the file grows until
the disk is full, and a journal that cannot write acts on nothing.

A prune deletes, oldest first, ended runs (with their steps and firings), events and
firings of no kept run: first all older than `max_age`, then, while the data is over
`max_bytes`, more of the oldest. It never deletes:
- a run not ended, or queued, started or ended within `keep` (the last N days), or
  within `budget_window` (the longest restart budget window of any model: the budget and
  its backoff count those runs, so its verdict is the same after a prune);
- the controls (pauses, open circuits) and budget resets: no prune touches those tables;
- the newest event of each decision that needs a person (NEEDS_A_PERSON: same kind,
  model and detail), whatever its age; its older repeats go.

All deletes are one transaction (a prune is done or not at all), on a connection of its
own, so the service's reads go on meanwhile (WAL). Then it gives the space back: the
file is switched to incremental auto-vacuum by one VACUUM the first time, after which
`PRAGMA incremental_vacuum` returns free pages cheaply, and the WAL is checkpointed.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.remediator.journal.decisions import NEEDS_SQL
from mlx_medic.remediator.journal.schema import connect
from mlx_medic.remediator.journal.store import placeholders

# A run's last sign of life: kept while any of its times is recent.
RUN_TIME = "max(queued_at, COALESCE(started_at, 0), COALESCE(ended_at, 0))"
# The newest event of each decision that needs a person: never pruned.
NEWEST_NEEDS = f"SELECT max(id) FROM events WHERE {NEEDS_SQL} GROUP BY kind, model, detail"
EVENT_BATCH = 5000  # events per step of the size bound: fine enough, few statements
INCREMENTAL = 2  # PRAGMA auto_vacuum's value for incremental


@dataclass(frozen=True)
class Retention:
    """The bounds, in seconds and bytes."""

    max_age: float
    max_bytes: int
    keep: float  # runs of this last span always stay
    budget_window: float = 0.0  # the longest budget window of any model: its runs stay


@dataclass(frozen=True)
class PruneResult:
    """What a prune removed (or would: `dry_run`), and the journal's size around it."""

    runs: int
    steps: int
    firings: int
    events: int
    bytes_before: int
    bytes_after: int
    dry_run: bool

    def rows(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "steps": self.steps,
            "firings": self.firings,
            "events": self.events,
        }

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        rows = ", ".join(f"{count} {table}" for table, count in self.rows().items())
        size = (
            f"{self.bytes_before} bytes on disk"
            if self.dry_run
            else f"{self.bytes_before} -> {self.bytes_after} bytes on disk"
        )
        return f"{verb} {rows}; {size}"


def journal_bytes(path: Path) -> int:
    """The journal's size on disk: the file and its WAL."""
    total = 0
    for name in (path, Path(f"{path}-wal")):
        with suppress(FileNotFoundError):
            total += os.stat(name).st_size
    return total


def prune(
    path: Path, retention: Retention, *, now: float | None = None, dry_run: bool = False
) -> PruneResult:
    """Delete what `retention` lets go, in one transaction, and give the space back;
    `dry_run`: the same deletes, rolled back, so the counts are what a prune would do."""
    now = time.time() if now is None else now
    before = journal_bytes(path)
    with closing(connect(path)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            counts = _delete(db, retention, now)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("ROLLBACK" if dry_run else "COMMIT")
        if not dry_run and any(counts.values()):
            _reclaim(db)
    return PruneResult(
        **counts, bytes_before=before, bytes_after=journal_bytes(path), dry_run=dry_run
    )


def _delete(db: sqlite3.Connection, retention: Retention, now: float) -> dict[str, int]:
    """Everything older than max_age, then the oldest while the data is over max_bytes."""
    runs_floor = now - max(retention.keep, retention.budget_window)
    counts = dict.fromkeys(("runs", "steps", "firings", "events"), 0)
    for cutoff in _cutoffs(db, now - retention.max_age, runs_floor, retention.max_bytes):
        for table, count in _delete_through(db, cutoff, runs_floor).items():
            counts[table] += count
    return counts


def _cutoffs(
    db: sqlite3.Connection, age_cutoff: float, runs_floor: float, max_bytes: int
) -> Iterator[float]:
    """The times up to which to delete: the age bound, then, while the data is over
    `max_bytes`, the next EVENT_BATCH events or the next deletable run, oldest first."""
    yield age_cutoff
    after = age_cutoff
    while _data_bytes(db) > max_bytes:
        events = db.execute(
            "SELECT max(time) FROM (SELECT time FROM events WHERE time>? ORDER BY time LIMIT ?)",
            (after, EVENT_BATCH),
        ).fetchone()[0]
        run = db.execute(
            f"SELECT min({RUN_TIME}) FROM runs WHERE ended_at IS NOT NULL"
            f" AND {RUN_TIME}>? AND {RUN_TIME}<?",
            (after, runs_floor),
        ).fetchone()[0]
        found = [float(t) for t in (events, run) if t is not None]
        if not found:
            return  # only what is kept is left
        after = min(found)
        yield after


def _delete_through(db: sqlite3.Connection, cutoff: float, runs_floor: float) -> dict[str, int]:
    """Delete ended runs (with steps and firings) of last activity at `cutoff` or before
    but before `runs_floor`, events from `cutoff` back but the newest of each that needs
    a person, and firings that old of no run still here."""
    doomed = [
        int(row[0])
        for row in db.execute(
            f"SELECT id FROM runs WHERE ended_at IS NOT NULL AND {RUN_TIME}<=? AND {RUN_TIME}<?",
            (cutoff, runs_floor),
        )
    ]
    counts = dict.fromkeys(("runs", "steps", "firings"), 0)
    for start in range(0, len(doomed), 500):
        ids = doomed[start : start + 500]
        marks = placeholders(len(ids))
        for table, column in (("steps", "run_id"), ("firings", "run_id"), ("runs", "id")):
            counts[table] += db.execute(
                f"DELETE FROM {table} WHERE {column} IN ({marks})", ids
            ).rowcount
    counts["firings"] += db.execute(
        "DELETE FROM firings WHERE time<=?"
        " AND (run_id IS NULL OR run_id NOT IN (SELECT id FROM runs))",
        (cutoff,),
    ).rowcount
    counts["events"] = db.execute(
        f"DELETE FROM events WHERE time<=? AND id NOT IN ({NEWEST_NEEDS})", (cutoff,)
    ).rowcount
    return counts


def _data_bytes(db: sqlite3.Connection) -> int:
    """The bytes the journal's rows take: its pages less the free ones (what this
    transaction freed counts as free already)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def _reclaim(db: sqlite3.Connection) -> None:
    """Free pages back to the file system, then the WAL truncated. A file made without
    incremental auto-vacuum is switched to it by one VACUUM (which writes the whole file
    once); from then on freeing costs only the pages freed."""
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] != INCREMENTAL:
        db.execute(f"PRAGMA auto_vacuum={INCREMENTAL}")
        db.execute("VACUUM")
    else:
        # executescript steps it to the end; execute() would free a single page
        db.executescript("PRAGMA incremental_vacuum")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
