"""The journal's connection and its write discipline: one lock, one write transaction at
a time, writes deferred to the next commit, and telling when the journal cannot record.

A journal that cannot record is a reason to act on nothing: a failed write raises
JournalError (and is remembered until a write succeeds), and `problem()` also notices a
file that was removed or replaced under the running process (its writes would then land
where no other process reads).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from mlx_medic.remediator.journal.files import file_identity, make_journal_file, narrow_modes
from mlx_medic.remediator.journal.schema import connect, connect_read_only

# The rows a write may defer (see JournalStore.__init__), written as they are when not.
INSERT_EVENT = (
    "INSERT INTO events (time, kind, model, fingerprint, run_id, detail) VALUES (?,?,?,?,?,?)"
)
INSERT_FIRING = (
    "INSERT OR IGNORE INTO firings (fingerprint, starts_at, model, run_id, time) VALUES (?,?,?,?,?)"
)


class JournalError(RuntimeError):
    """A write to the journal failed (disk full, I/O error, read-only file): nothing it
    was to record happened."""


def placeholders(count: int) -> str:
    """`?,?,?` for an `IN (...)` of `count` values."""
    return ",".join("?" * count)


class JournalStore:
    """The connection the reads and writes share. Both take `_lock` (through `_tx` and
    `_query`): the web app reads in worker threads while the event loop writes."""

    def __init__(self, path: Path | str, *, read_only: bool = False):
        """`read_only`: the journal is read as it is, never created, changed or narrowed
        (`mlx-medic log --journal`, of another replica's journal); a write then fails."""
        self.path = Path(path)
        if not read_only:
            make_journal_file(self.path)
        self._lock = threading.RLock()
        self._db = connect_read_only(self.path) if read_only else connect(self.path)
        self.write_failure: str | None = None  # why the last write failed; None once one works
        # Deferred writes (events, absorbed firings): flushed in one transaction by
        # flush(), before any read, and with the next write. An alert storm then costs
        # one commit per batch, not one per delivery.
        self._pending_events: list[tuple[Any, ...]] = []
        self._pending_firings: list[tuple[Any, ...]] = []
        self._pending_firing_keys: set[tuple[str, str]] = set()
        if not read_only:
            narrow_modes(self.path)  # the -wal and -shm the schema's writes just made
        self._identity = file_identity(self.path)  # the file this connection writes

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
            db.executemany(INSERT_EVENT, self._pending_events)
        if self._pending_firings:
            db.executemany(INSERT_FIRING, self._pending_firings)

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
            identity = file_identity(self.path)
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
