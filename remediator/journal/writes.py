"""Everything that records: runs and their steps as they go, events, firings (the
durable dedupe of alerts), pauses and circuits, and start-up's marking of what a dead
process left in flight.

A step is written *before* it starts, so a killed process leaves a `running` step that
start-up turns into `interrupted`.
"""

from __future__ import annotations

import json
import sqlite3
import time

from mlx_medic.remediator.journal.owner import owner_gone, this_host
from mlx_medic.remediator.journal.store import (
    INSERT_EVENT,
    INSERT_FIRING,
    JournalStore,
    placeholders,
)
from mlx_medic.remediator.label_limits import bounded_labels
from mlx_medic.remediator.links import bounded_links
from mlx_medic.remediator.outcomes import (
    RUN_ENDED,
    RUN_HOLDS_FIRING,
    RUN_IN_FLIGHT,
    RunOutcome,
    StepOutcome,
)

OUTPUT_CAP = 4000  # characters of command output kept per step


class JournalWrites(JournalStore):
    """The journal's writes; each is one transaction (or deferred to the next one)."""

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

    def record_recheck(self, run_id: int, recheck: str) -> None:
        """Why the run acted or did not: its re-check's verdict, what was probed, from where
        (a later re-check, after a wait for the lock, replaces it)."""
        with self._tx() as db:
            db.execute("UPDATE runs SET recheck=? WHERE id=?", (recheck, run_id))

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
        condition: str | None = None,
    ) -> int:
        """Written before the step starts: a crash leaves it `running`. A step a dry run
        plans (`planned`) never runs: it has no end (and no duration)."""
        ends = outcome not in (StepOutcome.RUNNING, StepOutcome.PLANNED)
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO steps (run_id, seq, name, node, command, description, targets,"
                " condition, outcome, started_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    seq,
                    name,
                    node,
                    None if command is None else json.dumps(command),
                    description,
                    json.dumps(targets),
                    condition,
                    StepOutcome(outcome).value,
                    now,
                    now if ends else None,
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
        host = hostname or this_host()
        ids = [
            int(row["id"])
            for row in self._query(
                "SELECT id, owner FROM runs WHERE outcome IN (?, ?)",
                [o.value for o in RUN_IN_FLIGHT],
            )
            if owner_gone(str(row["owner"]), host)
        ]
        if not ids:
            return []
        marks = placeholders(len(ids))
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
            return int(db.execute(INSERT_EVENT, row).lastrowid or 0)

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
        links: dict[str, str] | None = None,
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
                links,
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


def _insert_firing(
    db: sqlite3.Connection,
    fingerprint: str,
    starts_at: str,
    model: str,
    run_id: int | None,
    now: float,
) -> bool:
    """True if this firing is new; the table's key makes the check atomic across processes."""
    cursor = db.execute(INSERT_FIRING, (fingerprint, starts_at, model, run_id, now))
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
    links: dict[str, str] | None = None,
) -> int:
    """A queued run; its id. Its labels and links are stored bounded (label_limits)."""
    kept_links = bounded_links(links)
    cursor = db.execute(
        "INSERT INTO runs (model, playbook, trigger_kind, alertname, fingerprint,"
        " starts_at, labels, dry_run, owner, outcome, queued_at, links)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            model,
            playbook,
            trigger_kind,
            alertname,
            fingerprint,
            starts_at,
            json.dumps(bounded_labels(labels), sort_keys=True),
            int(dry_run),
            owner,
            RunOutcome.QUEUED.value,
            now,
            json.dumps(kept_links) if kept_links else None,
        ),
    )
    return int(cursor.lastrowid or 0)
