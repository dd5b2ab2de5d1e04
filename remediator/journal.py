"""The journal: every run, step, decision and control in one SQLite file (WAL).

Why SQLite: the remediator, `mlx-medic log`, `pause` and `resume` are separate
processes that must see each other's writes at once (a pause reaches a running
service), and a crash must leave what was in flight visible. A step is written
*before* it starts, so a killed process leaves a `running` step that start-up
turns into `interrupted`. Commits are `synchronous=FULL` (a power cut keeps what was
committed), and the journal with its -wal and -shm is 0640: the service's user writes
it, its group (`mlx-medic`) may read it, nobody else.

A journal that cannot record is a reason to act on nothing: a failed write raises
JournalError (and is remembered until a write succeeds), and `problem()` also notices a
file that was removed or replaced under the running process (its writes would then land
where no other process reads).
"""

from __future__ import annotations

import grp
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlx_medic.remediator.outcomes import (
    RUN_ENDED,
    RUN_HOLDS_FIRING,
    RUN_IN_FLIGHT,
    RunOutcome,
    StepOutcome,
)
from mlx_medic.state_layout import STATE_GROUP

OUTPUT_CAP = 4000  # characters of command output kept per step
JOURNAL_MODE = 0o640  # the journal and its -wal, -shm: the service's user, its group reads
# Its dir stays searchable: the files' own mode keeps them private, and an on-call user
# without rights then gets the refusal that names the journal's owner, not EACCES.
JOURNAL_DIR_MODE = 0o755

_SCHEMA = """
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
    ended_at      REAL
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


def _loads(text: str | None, default: Any) -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


@dataclass
class StepView:
    id: int
    run_id: int
    seq: int
    name: str
    node: str
    command: list[str] | None
    description: str
    targets: list[str]
    outcome: str
    exit_status: int | None
    output: str
    detail: str
    started_at: float
    ended_at: float | None

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration": self.duration}


@dataclass
class RunView:
    id: int
    model: str
    playbook: str
    trigger_kind: str
    alertname: str | None
    fingerprint: str | None
    starts_at: str | None
    labels: dict[str, str]
    dry_run: bool
    owner: str
    outcome: str
    detail: str
    next_action: str | None
    counted: bool
    queued_at: float
    started_at: float | None
    ended_at: float | None
    steps: list[StepView] = field(default_factory=list)

    @property
    def duration(self) -> float | None:
        begin = self.started_at if self.started_at is not None else self.queued_at
        return None if self.ended_at is None else self.ended_at - begin

    @property
    def trigger(self) -> str:
        """`manual`, `start-up` (a service a run left stopped), or the alert's fingerprint
        (what on-call greps Alertmanager for)."""
        if self.trigger_kind == "startup":
            return "start-up"
        return "manual" if self.trigger_kind == "manual" else f"alert {self.fingerprint or '?'}"

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "steps"}
        data["duration"] = self.duration
        data["trigger"] = self.trigger
        data["steps"] = [s.to_dict() for s in self.steps]
        return data


@dataclass
class EventView:
    id: int
    time: float
    kind: str
    model: str | None
    fingerprint: str | None
    run_id: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ControlView:
    kind: str  # 'pause' | 'circuit'
    model: str | None  # None: every model
    reason: str
    next_action: str | None
    by_whom: str
    since: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JournalError(RuntimeError):
    """A write to the journal failed (disk full, I/O error, read-only file): nothing it
    was to record happened."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_journal_file(path: Path) -> None:
    """Create the journal JOURNAL_MODE (group `mlx-medic` when it is one of ours) before
    SQLite does: SQLite makes it 0644 and gives its -wal and -shm the journal's own mode,
    so every file of it is readable by the service's user and group only. Missing dirs
    are made JOURNAL_DIR_MODE. A journal of ours an older version left wider is narrowed."""
    missing = [d for d in (path.parent, *path.parent.parents) if not d.is_dir()]
    for directory in reversed(missing):
        with suppress(FileExistsError):
            os.mkdir(directory, JOURNAL_DIR_MODE)
            os.chmod(directory, JOURNAL_DIR_MODE)  # the umask may have narrowed it
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, JOURNAL_MODE)
    except FileExistsError:
        _narrow_modes(path)
        return
    except OSError:
        return  # SQLite says why, naming the file
    try:
        os.fchmod(fd, JOURNAL_MODE)
        with suppress(KeyError, PermissionError):  # not a group of ours: our own
            os.fchown(fd, -1, grp.getgrnam(STATE_GROUP).gr_gid)
    finally:
        os.close(fd)


def _narrow_modes(path: Path) -> None:
    """The journal, -wal and -shm this user owns: readable by its group at most."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with suppress(OSError):
            info = os.stat(name)
            if info.st_uid == os.geteuid() and info.st_mode & 0o7137:
                os.chmod(name, stat.S_IMODE(info.st_mode) & JOURNAL_MODE)


class Journal:
    """One SQLite file shared by the service and the CLI. Calls are short and
    synchronous (microseconds), so asyncio code calls them directly."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        _make_journal_file(self.path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            str(self.path), timeout=10.0, isolation_level=None, check_same_thread=False
        )
        self.write_failure: str | None = None  # why the last write failed; None once one works
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed step or pause survives a power cut too, not only a crash (NORMAL
        # in WAL mode may lose the last commits); a journal write costs one more fsync.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.execute("PRAGMA foreign_keys=ON")
        # Deferred writes (events, absorbed firings): flushed in one transaction by
        # flush(), before any read, and with the next write. An alert storm then costs
        # one commit per batch, not one per delivery.
        self._pending_events: list[tuple[Any, ...]] = []
        self._pending_firings: list[tuple[Any, ...]] = []
        self._pending_firing_keys: set[tuple[str, str]] = set()
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self._db.execute(statement)
        _narrow_modes(self.path)  # the -wal and -shm the schema's writes just made
        self._identity = _file_identity(self.path)  # the file this connection writes

    def close(self) -> None:
        with self._lock:
            self.flush()
            self._db.close()

    @property
    def pending(self) -> int:
        return len(self._pending_events) + len(self._pending_firings)

    def flush(self) -> None:
        """Write deferred events and firings now."""
        with self._lock:
            if self.pending:
                with self._tx():
                    pass  # _tx writes what is pending

    def _write_pending(self, db: sqlite3.Connection) -> None:
        if self._pending_events:
            db.executemany(
                "INSERT INTO events (time, kind, model, fingerprint, run_id, detail)"
                " VALUES (?,?,?,?,?,?)",
                self._pending_events,
            )
        if self._pending_firings:
            db.executemany(
                "INSERT OR IGNORE INTO firings (fingerprint, starts_at, model, run_id, time)"
                " VALUES (?,?,?,?,?)",
                self._pending_firings,
            )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE so writers from other processes queue.
        A database or OS error becomes JournalError, remembered in `write_failure`."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._write_pending(self._db)
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                if self._db.in_transaction:
                    with suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                self.write_failure = f"cannot write the journal {self.path}: {exc}"
                raise JournalError(self.write_failure) from exc
            self.write_failure = None
            self._pending_events, self._pending_firings = [], []
            self._pending_firing_keys = set()

    def problem(self) -> str | None:
        """Why this journal cannot be trusted to record now, or None: its file is gone or
        was replaced (this process would write where nobody reads), or the last write
        failed."""
        try:
            identity = _file_identity(self.path)
        except FileNotFoundError:
            return (
                f"the journal file {self.path} is gone (removed, or its directory was):"
                " this process writes where no other process reads; restart the service"
            )
        except OSError as exc:
            return f"cannot check the journal file {self.path}: {exc.strerror or exc}"
        if identity != self._identity:
            return (
                f"the journal file {self.path} was replaced by another file:"
                " this process still writes to the old one; restart the service"
            )
        return self.write_failure

    def _query(
        self, sql: str, params: Sequence[Any] = (), *, flush: bool = True
    ) -> list[sqlite3.Row]:
        with self._lock:
            if flush:
                self.flush()
            return self._db.execute(sql, params).fetchall()

    # --- runs and steps ---------------------------------------------------

    def create_run(
        self,
        *,
        model: str,
        playbook: str,
        trigger_kind: str,
        owner: str,
        now: float,
        alertname: str | None = None,
        fingerprint: str | None = None,
        starts_at: str | None = None,
        labels: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> int:
        with self._tx() as db:
            return _insert_run(
                db,
                model,
                playbook,
                trigger_kind,
                alertname,
                fingerprint,
                starts_at,
                labels or {},
                dry_run,
                owner,
                now,
            )

    def start_run(self, run_id: int, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET outcome=?, started_at=? WHERE id=?",
                (RunOutcome.RUNNING.value, now, run_id),
            )

    def mark_counted(self, run_id: int) -> None:
        """The run acted on the nodes: it spends the model's restart budget."""
        with self._tx() as db:
            db.execute("UPDATE runs SET counted=1 WHERE id=?", (run_id,))

    def end_run(
        self,
        run_id: int,
        outcome: RunOutcome,
        now: float,
        detail: str = "",
        next_action: str | None = None,
    ) -> None:
        if outcome not in RUN_ENDED:
            ended = ", ".join(RUN_ENDED)
            raise ValueError(f"unknown run outcome {outcome!r}; expected one of {ended}")
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET outcome=?, detail=?, next_action=?, ended_at=? WHERE id=?",
                (RunOutcome(outcome).value, detail, next_action, now, run_id),
            )
            if outcome not in RUN_HOLDS_FIRING:  # its firings may start a run again
                db.execute("DELETE FROM firings WHERE run_id=?", (run_id,))

    def begin_step(
        self,
        run_id: int,
        *,
        seq: int,
        name: str,
        node: str,
        command: list[str] | None,
        description: str,
        targets: list[str],
        now: float,
        outcome: StepOutcome = StepOutcome.RUNNING,
    ) -> int:
        """Written before the step starts: a crash leaves it `running`."""
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO steps (run_id, seq, name, node, command, description, targets,"
                " outcome, started_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    seq,
                    name,
                    node,
                    None if command is None else json.dumps(command),
                    description,
                    json.dumps(targets),
                    StepOutcome(outcome).value,
                    now,
                    None if outcome == StepOutcome.RUNNING else now,
                ),
            )
            return int(cursor.lastrowid or 0)

    def end_step(
        self,
        step_id: int,
        outcome: StepOutcome,
        now: float,
        *,
        exit_status: int | None = None,
        output: str = "",
        detail: str = "",
    ) -> None:
        if outcome not in set(StepOutcome):
            known = ", ".join(StepOutcome)
            raise ValueError(f"unknown step outcome {outcome!r}; expected one of {known}")
        if len(output) > OUTPUT_CAP:
            half = OUTPUT_CAP // 2
            output = output[:half] + "\n[... output cut ...]\n" + output[-half:]
        with self._tx() as db:
            db.execute(
                "UPDATE steps SET outcome=?, exit_status=?, output=?, detail=?, ended_at=?"
                " WHERE id=?",
                (StepOutcome(outcome).value, exit_status, output, detail, now, step_id),
            )

    def mark_interrupted(self, now: float | None = None, hostname: str | None = None) -> list[int]:
        """Runs left in flight by a process of this host that is gone become
        `interrupted`, with their running steps. Returns their ids. Runs of a live
        process (another replica on the same file) are left alone."""
        now = time.time() if now is None else now
        host = hostname or _this_host()
        ids: list[int] = []
        for row in self._query(
            "SELECT id, owner FROM runs WHERE outcome IN (?, ?)", [o.value for o in RUN_IN_FLIGHT]
        ):
            owner_host, _, pid = str(row["owner"]).rpartition(":")
            if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
                ids.append(int(row["id"]))
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        with self._tx() as db:
            db.execute(
                f"UPDATE steps SET outcome=?, ended_at=?,"
                f" detail='the remediator stopped while this step ran'"
                f" WHERE outcome=? AND run_id IN ({marks})",
                (StepOutcome.INTERRUPTED.value, now, StepOutcome.RUNNING.value, *ids),
            )
            db.execute(
                f"UPDATE runs SET outcome=?, ended_at=?,"
                f" detail='the remediator stopped during this run; found at start-up'"
                f" WHERE id IN ({marks})",
                (RunOutcome.INTERRUPTED.value, now, *ids),
            )
            db.execute(f"DELETE FROM firings WHERE run_id IN ({marks})", ids)
        return ids

    def get_run(self, run_id: int) -> RunView | None:
        rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            return None
        return self._with_steps([rows[0]])[0]

    def list_runs(
        self, model: str | None = None, since: float | None = None, limit: int = 50
    ) -> list[RunView]:
        """Newest first, each with its steps in order."""
        sql = "SELECT * FROM runs WHERE 1=1"
        params: list[Any] = []
        if model is not None:
            sql += " AND model=?"
            params.append(model)
        if since is not None:
            sql += " AND queued_at>=?"
            params.append(since)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(max(0, int(limit)))
        return self._with_steps(self._query(sql, params))

    def _with_steps(self, rows: list[sqlite3.Row]) -> list[RunView]:
        runs = [
            RunView(
                id=r["id"],
                model=r["model"],
                playbook=r["playbook"],
                trigger_kind=r["trigger_kind"],
                alertname=r["alertname"],
                fingerprint=r["fingerprint"],
                starts_at=r["starts_at"],
                labels=_loads(r["labels"], {}),
                dry_run=bool(r["dry_run"]),
                owner=r["owner"],
                outcome=r["outcome"],
                detail=r["detail"],
                next_action=r["next_action"],
                counted=bool(r["counted"]),
                queued_at=r["queued_at"],
                started_at=r["started_at"],
                ended_at=r["ended_at"],
            )
            for r in rows
        ]
        if not runs:
            return runs
        by_id = {run.id: run for run in runs}
        marks = ",".join("?" * len(by_id))
        for s in self._query(
            f"SELECT * FROM steps WHERE run_id IN ({marks}) ORDER BY run_id, seq, id",
            list(by_id),
        ):
            by_id[s["run_id"]].steps.append(
                StepView(
                    id=s["id"],
                    run_id=s["run_id"],
                    seq=s["seq"],
                    name=s["name"],
                    node=s["node"],
                    command=_loads(s["command"], None),
                    description=s["description"],
                    targets=_loads(s["targets"], []),
                    outcome=s["outcome"],
                    exit_status=s["exit_status"],
                    output=s["output"],
                    detail=s["detail"],
                    started_at=s["started_at"],
                    ended_at=s["ended_at"],
                )
            )
        return runs

    def counted_run_times(
        self,
        model: str,
        since: float,
        *,
        playbook: str | None = None,
        exclude: Sequence[str] = (),
    ) -> list[float]:
        """Start times of runs that acted on the model's nodes since `since`, oldest first:
        only those of `playbook` when given, never those of the playbooks in `exclude`."""
        where, params = "", [model, since]
        if playbook is not None:
            where += " AND playbook=?"
            params.append(playbook)
        if exclude:
            where += f" AND playbook NOT IN ({','.join('?' * len(exclude))})"
            params += list(exclude)
        rows = self._query(
            "SELECT COALESCE(started_at, queued_at) AS t FROM runs WHERE model=? AND counted=1"
            f" AND COALESCE(started_at, queued_at)>=?{where} ORDER BY t",
            tuple(params),
        )
        return [float(r["t"]) for r in rows]

    # --- events and firings ----------------------------------------------

    def add_event(
        self,
        kind: str,
        *,
        now: float,
        model: str | None = None,
        fingerprint: str | None = None,
        run_id: int | None = None,
        detail: str = "",
        defer: bool = False,
    ) -> int:
        """The event's id; 0 when deferred (written by the next flush, read or write)."""
        row = (now, kind, model, fingerprint, run_id, detail)
        if defer:
            with self._lock:
                self._pending_events.append(row)
            return 0
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO events (time, kind, model, fingerprint, run_id, detail)"
                " VALUES (?,?,?,?,?,?)",
                row,
            )
            return int(cursor.lastrowid or 0)

    def list_events(
        self,
        model: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        limit: int = 100,
    ) -> list[EventView]:
        """Newest first."""
        sql = "SELECT * FROM events WHERE 1=1"
        params: list[Any] = []
        for column, value in (("model", model), ("kind", kind)):
            if value is not None:
                sql += f" AND {column}=?"
                params.append(value)
        if since is not None:
            sql += " AND time>=?"
            params.append(since)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(max(0, int(limit)))
        return [
            EventView(
                id=r["id"],
                time=r["time"],
                kind=r["kind"],
                model=r["model"],
                fingerprint=r["fingerprint"],
                run_id=r["run_id"],
                detail=r["detail"],
            )
            for r in self._query(sql, params)
        ]

    def firing_seen(self, fingerprint: str, starts_at: str) -> bool:
        """True if this firing started or joined a run that is in flight or succeeded
        (durable dedupe; a run's other endings forget its firings, see end_run)."""
        with self._lock:
            if (fingerprint, starts_at) in self._pending_firing_keys:
                return True
            rows = self._query(
                "SELECT 1 FROM firings WHERE fingerprint=? AND starts_at=?",
                (fingerprint, starts_at),
                flush=False,
            )
        return bool(rows)

    def record_firing(
        self,
        fingerprint: str,
        starts_at: str,
        model: str,
        run_id: int | None,
        now: float,
        *,
        defer: bool = False,
    ) -> bool:
        """True if recorded now; False if it was already there (a duplicate).
        Deferred: always True; the caller already knows it is new."""
        if defer:
            with self._lock:
                self._pending_firings.append((fingerprint, starts_at, model, run_id, now))
                self._pending_firing_keys.add((fingerprint, starts_at))
            return True
        with self._tx() as db:
            return _insert_firing(db, fingerprint, starts_at, model, run_id, now)

    def create_alert_run(
        self,
        *,
        model: str,
        playbook: str,
        owner: str,
        now: float,
        alertname: str,
        fingerprint: str,
        starts_at: str,
        labels: dict[str, str],
        dry_run: bool,
    ) -> int | None:
        """Record the firing and its run in one transaction; None if the firing was
        already recorded (a duplicate, perhaps from another process)."""
        with self._tx() as db:
            if not _insert_firing(db, fingerprint, starts_at, model, None, now):
                return None
            run_id = _insert_run(
                db,
                model,
                playbook,
                "alert",
                alertname,
                fingerprint,
                starts_at,
                labels,
                dry_run,
                owner,
                now,
            )
            db.execute(
                "UPDATE firings SET run_id=? WHERE fingerprint=? AND starts_at=?",
                (run_id, fingerprint, starts_at),
            )
            return run_id

    # --- controls: pause, circuit ----------------------------------------

    def set_pause(self, model: str | None, *, reason: str, by_whom: str, now: float) -> bool:
        """True if newly paused, False if it already was."""
        key = f"pause:{model or '*'}"
        with self._tx() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO controls (key, kind, model, reason, by_whom, since)"
                " VALUES (?, 'pause', ?, ?, ?, ?)",
                (key, model, reason, by_whom, now),
            )
            return cursor.rowcount == 1

    def clear_pause(self, model: str | None) -> bool:
        with self._tx() as db:
            cursor = db.execute("DELETE FROM controls WHERE key=?", (f"pause:{model or '*'}",))
            return cursor.rowcount == 1

    def open_circuit(
        self, model: str, *, reason: str, next_action: str, by_whom: str, now: float
    ) -> bool:
        """True if it opened now, False if it was already open (first reason kept)."""
        with self._tx() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO controls"
                " (key, kind, model, reason, next_action, by_whom, since)"
                " VALUES (?, 'circuit', ?, ?, ?, ?, ?)",
                (f"circuit:{model}", model, reason, next_action, by_whom, now),
            )
            return cursor.rowcount == 1

    def close_circuit(self, model: str, now: float) -> bool:
        """Closing by hand also resets the model's budget window: a fresh start."""
        with self._tx() as db:
            cursor = db.execute("DELETE FROM controls WHERE key=?", (f"circuit:{model}",))
            db.execute(
                "INSERT INTO budget_resets (model, since) VALUES (?, ?)"
                " ON CONFLICT(model) DO UPDATE SET since=excluded.since",
                (model, now),
            )
            return cursor.rowcount == 1

    def budget_reset_time(self, model: str) -> float | None:
        rows = self._query("SELECT since FROM budget_resets WHERE model=?", (model,))
        return float(rows[0]["since"]) if rows else None

    def controls(self) -> list[ControlView]:
        return [
            ControlView(
                kind=r["kind"],
                model=r["model"],
                reason=r["reason"],
                next_action=r["next_action"],
                by_whom=r["by_whom"],
                since=r["since"],
            )
            for r in self._query("SELECT * FROM controls ORDER BY since")
        ]

    def blocking_control(self, model: str) -> ControlView | None:
        """The pause or open circuit that stops automatic action for `model`, if any."""
        rows = self._query(
            "SELECT * FROM controls WHERE key IN ('pause:*', ?, ?)"
            " ORDER BY CASE kind WHEN 'pause' THEN 0 ELSE 1 END, since",
            (f"pause:{model}", f"circuit:{model}"),
        )
        if not rows:
            return None
        r = rows[0]
        return ControlView(
            kind=r["kind"],
            model=r["model"],
            reason=r["reason"],
            next_action=r["next_action"],
            by_whom=r["by_whom"],
            since=r["since"],
        )


def _file_identity(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _this_host() -> str:
    import socket

    return socket.gethostname()


def owner_tag(hostname: str | None = None, pid: int | None = None) -> str:
    """`host:pid`: who runs a run, so start-up can tell a dead owner from a live one."""
    return f"{hostname or _this_host()}:{pid or os.getpid()}"


def _insert_firing(
    db: sqlite3.Connection,
    fingerprint: str,
    starts_at: str,
    model: str,
    run_id: int | None,
    now: float,
) -> bool:
    """True if this firing is new; the table's key makes the check atomic across processes."""
    cursor = db.execute(
        "INSERT OR IGNORE INTO firings (fingerprint, starts_at, model, run_id, time)"
        " VALUES (?,?,?,?,?)",
        (fingerprint, starts_at, model, run_id, now),
    )
    return cursor.rowcount == 1


def _insert_run(
    db: sqlite3.Connection,
    model: str,
    playbook: str,
    trigger_kind: str,
    alertname: str | None,
    fingerprint: str | None,
    starts_at: str | None,
    labels: dict[str, str],
    dry_run: bool,
    owner: str,
    now: float,
) -> int:
    """A queued run; its id."""
    cursor = db.execute(
        "INSERT INTO runs (model, playbook, trigger_kind, alertname, fingerprint,"
        " starts_at, labels, dry_run, owner, outcome, queued_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (
            model,
            playbook,
            trigger_kind,
            alertname,
            fingerprint,
            starts_at,
            json.dumps(labels, sort_keys=True),
            int(dry_run),
            owner,
            RunOutcome.QUEUED.value,
            now,
        ),
    )
    return int(cursor.lastrowid or 0)
