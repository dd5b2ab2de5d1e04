"""Everything that reads: runs with their steps, events, controls, and the answers the
engine and the budget ask for (a firing already seen, counted runs, a budget reset).
Every read but `firing_seen` first flushes deferred writes, so it sees them."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from mlx_medic.remediator.journal.decisions import recent_decisions
from mlx_medic.remediator.journal.store import JournalStore, placeholders
from mlx_medic.remediator.journal.views import (
    ControlView,
    DecisionView,
    EventView,
    RunView,
    control_view,
    event_view,
    run_view,
    step_view,
)


class JournalReads(JournalStore):
    """The journal's reads; none of them writes but the flush of what is deferred."""

    # --- runs and steps ---------------------------------------------------

    def get_run(self, run_id: int) -> RunView | None:
        rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            return None
        return self._with_steps([rows[0]])[0]

    def list_runs(
        self, model: str | None = None, since: float | None = None, limit: int = 50
    ) -> list[RunView]:
        """Newest first, each with its steps in order."""
        return self._with_steps(self._newest("runs", {"model": model}, "queued_at", since, limit))

    def unended_runs(self, playbook: str) -> list[RunView]:
        """The runs of `playbook`, every model's, that have not ended (queued or acting),
        oldest first, without their steps: the guarded reboot's "another node is being
        rebooted" (a run a dead process left is ended at its start-up)."""
        rows = self._query(
            "SELECT * FROM runs WHERE playbook=? AND ended_at IS NULL ORDER BY id", (playbook,)
        )
        return [run_view(r) for r in rows]

    def _with_steps(self, rows: list[sqlite3.Row]) -> list[RunView]:
        runs = [run_view(r) for r in rows]
        if not runs:
            return runs
        by_id = {run.id: run for run in runs}
        for s in self._query(
            f"SELECT * FROM steps WHERE run_id IN ({placeholders(len(by_id))})"
            " ORDER BY run_id, seq, id",
            list(by_id),
        ):
            by_id[s["run_id"]].steps.append(step_view(s))
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
            where += f" AND playbook NOT IN ({placeholders(len(exclude))})"
            params += list(exclude)
        rows = self._query(
            "SELECT COALESCE(started_at, queued_at) AS t FROM runs WHERE model=? AND counted=1"
            f" AND COALESCE(started_at, queued_at)>=?{where} ORDER BY t",
            tuple(params),
        )
        return [float(r["t"]) for r in rows]

    # --- events and firings ----------------------------------------------

    def list_events(
        self,
        model: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        limit: int = 100,
    ) -> list[EventView]:
        """Newest first."""
        rows = self._newest("events", {"model": model, "kind": kind}, "time", since, limit)
        return [event_view(r) for r in rows]

    def recent_decisions(
        self, model: str | None = None, since: float | None = None, limit: int = 25
    ) -> list[DecisionView]:
        """Newest first, repeats folded, those that need a person always among them
        (decisions.py): what `mlx-medic log`, `/` and `/api/remediations` show."""
        return recent_decisions(self._query, model, since, limit)

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

    # --- controls: pause, circuit ----------------------------------------

    def budget_reset_time(self, model: str) -> float | None:
        rows = self._query("SELECT since FROM budget_resets WHERE model=?", (model,))
        return float(rows[0]["since"]) if rows else None

    def controls(self) -> list[ControlView]:
        return [control_view(r) for r in self._query("SELECT * FROM controls ORDER BY since")]

    def blocking_control(self, model: str) -> ControlView | None:
        """The pause or open circuit that stops automatic action for `model`, if any."""
        rows = self._query(
            "SELECT * FROM controls WHERE key IN ('pause:*', ?, ?)"
            " ORDER BY CASE kind WHEN 'pause' THEN 0 ELSE 1 END, since",
            (f"pause:{model}", f"circuit:{model}"),
        )
        return control_view(rows[0]) if rows else None

    def _newest(
        self,
        table: str,
        equal: dict[str, Any],
        time_column: str,
        since: float | None,
        limit: int,
    ) -> list[sqlite3.Row]:
        """Rows of `table`, newest first: those whose columns in `equal` match (a None
        value matches all), from `since` on in `time_column`, at most `limit`."""
        sql = f"SELECT * FROM {table} WHERE 1=1"
        params: list[Any] = []
        for column, value in equal.items():
            if value is not None:
                sql += f" AND {column}=?"
                params.append(value)
        if since is not None:
            sql += f" AND {time_column}>=?"
            params.append(since)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(max(0, int(limit)))
        return self._query(sql, params)
