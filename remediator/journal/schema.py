"""The journal's SQLite layout: its tables and indexes (DDL) and the pragmas every
connection sets. Every statement is `IF NOT EXISTS`, so opening a journal an older
process wrote changes none of its rows: it reads as it did. An index a newer version
adds is built when it first opens the journal (once; an older version ignores it), and
so is a column (ADDED_COLUMNS: nullable, so the old rows read as NULL; an older version
never names it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mlx_medic.remediator.journal.decisions import LANDMARK_SQL, NEEDS_SQL

SCHEMA_TEMPLATE = """
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    model         TEXT NOT NULL,
    playbook      TEXT NOT NULL,
    trigger_kind  TEXT NOT NULL,           -- 'alert' | 'manual' | 'startup'
    alertname     TEXT,
    fingerprint   TEXT,
    starts_at     TEXT,
    labels        TEXT,                    -- JSON
    dry_run       INTEGER NOT NULL DEFAULT 0,
    owner         TEXT NOT NULL,           -- host:pid of the process that runs it
    outcome       TEXT NOT NULL,
    detail        TEXT NOT NULL DEFAULT '',
    next_action   TEXT,
    counted       INTEGER NOT NULL DEFAULT 0,  -- spent budget (acted on the nodes)
    queued_at     REAL NOT NULL,
    started_at    REAL,
    ended_at      REAL,
    links         TEXT                     -- JSON: the alert's runbook, generator, external URLs
);
CREATE INDEX IF NOT EXISTS runs_model_time ON runs(model, queued_at);
CREATE TABLE IF NOT EXISTS steps (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       INTEGER NOT NULL REFERENCES runs(id),
    seq          INTEGER NOT NULL,
    name         TEXT NOT NULL,
    node         TEXT NOT NULL,
    command      TEXT,                     -- JSON argv, or NULL for a described step
    description  TEXT NOT NULL DEFAULT '',
    targets      TEXT NOT NULL DEFAULT '[]',
    outcome      TEXT NOT NULL,
    exit_status  INTEGER,
    output       TEXT NOT NULL DEFAULT '',
    detail       TEXT NOT NULL DEFAULT '',
    started_at   REAL NOT NULL,
    ended_at     REAL
);
CREATE INDEX IF NOT EXISTS steps_run ON steps(run_id, seq);
CREATE TABLE IF NOT EXISTS events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    time         REAL NOT NULL,
    kind         TEXT NOT NULL,            -- a Disposition value or e.g. 'escalation'
    model        TEXT,
    fingerprint  TEXT,
    run_id       INTEGER,
    detail       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
-- recent decisions (decisions.py): partial, so a storm's repeats are in neither
CREATE INDEX IF NOT EXISTS events_needs_a_person ON events(kind, model, detail, time)
    WHERE {needs};
CREATE INDEX IF NOT EXISTS events_landmarks ON events(model, id) WHERE {landmarks};
CREATE INDEX IF NOT EXISTS events_model_kind ON events(model, kind, id, time);
CREATE TABLE IF NOT EXISTS firings (
    fingerprint  TEXT NOT NULL,
    starts_at    TEXT NOT NULL,
    model        TEXT NOT NULL,
    run_id       INTEGER,
    time         REAL NOT NULL,
    PRIMARY KEY (fingerprint, starts_at)
);
CREATE TABLE IF NOT EXISTS controls (
    key          TEXT PRIMARY KEY,         -- 'pause:*', 'pause:<model>', 'circuit:<model>'
    kind         TEXT NOT NULL,            -- 'pause' | 'circuit'
    model        TEXT,                     -- NULL for all models
    reason       TEXT NOT NULL DEFAULT '',
    next_action  TEXT,
    by_whom      TEXT NOT NULL DEFAULT '',
    since        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS budget_resets (
    model        TEXT PRIMARY KEY,         -- runs before `since` no longer count
    since        REAL NOT NULL
);
"""


SCHEMA = SCHEMA_TEMPLATE.format(needs=NEEDS_SQL, landmarks=LANDMARK_SQL)
# Columns added since a table was first released: (table, column, its type), as in SCHEMA.
ADDED_COLUMNS = (
    ("runs", "links", "TEXT"),  # the alert's runbook, Prometheus and Alertmanager URLs (JSON)
    ("runs", "recheck", "TEXT"),  # why the run acted: the re-check's verdict, what it probed
    ("steps", "condition", "TEXT"),  # when a step runs, if not always: "only if ..."
)


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the journal at `path` with the journal's pragmas and its schema.
    Autocommit (isolation_level None): the store opens every write transaction itself."""
    db = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed step or pause survives a power cut too, not only a crash (NORMAL
    # in WAL mode may lose the last commits); a journal write costs one more fsync.
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=10000")
    db.execute("PRAGMA foreign_keys=ON")
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    _add_columns(db)
    return db


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that reads the journal at `path` and creates and writes nothing. A
    journal in use (its -wal is there) is read with its -wal and -shm; one no process has
    open, from its file alone (`immutable`: read-only SQLite would create a -wal and -shm
    beside it). A file that is missing, unreadable or no journal raises OSError or
    sqlite3.Error."""
    with path.open("rb"):  # missing or unreadable: said as such, not as SQLite's "unable to open"
        pass
    in_use = Path(f"{path}-wal").exists()
    uri = f"{path.resolve().as_uri()}?{'mode=ro' if in_use else 'immutable=1'}"
    db = sqlite3.connect(uri, uri=True, timeout=10.0, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA busy_timeout=10000")
    db.execute("SELECT 1 FROM runs LIMIT 1")  # a journal, not some other file
    return db


def _add_columns(db: sqlite3.Connection) -> None:
    """The ADDED_COLUMNS a journal written before them lacks. Another process opening it
    at the same moment may add one first: its "duplicate column" is no failure."""
    for table, column, kind in ADDED_COLUMNS:
        present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
        if column in present:
            continue
        try:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):
                raise
