"""The engine's writes to the journal, and whether it can write at all.

Every decision is on disk before `submit` returns, except the storm's repeats
(DUPLICATE, ABSORBED): those are deferred and flushed in batches within FLUSH_DELAY
(see Journal.flush). A run's end that a failing journal refuses is kept and written once
it records again; meanwhile `problem` says why nothing may act."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from mlx_medic.remediator.active_run import RunEnd
from mlx_medic.remediator.alerts import AlertEvent, Disposition
from mlx_medic.remediator.journal import Journal, JournalError
from mlx_medic.remediator.outcomes import RunOutcome

log = logging.getLogger("mlx_medic.remediator.engine")  # the engine's parts log as one

FLUSH_DELAY = 0.05
# The storm's repeats: journaled in batches; every other decision is on disk at once.
_DEFERRED = {Disposition.DUPLICATE, Disposition.ABSORBED}


class DecisionRecords:
    """The engine's journal writes: decision events, deferred or at once, and run ends
    kept until a failing journal records again."""

    def __init__(self, journal: Journal, clock: Callable[[], float]) -> None:
        self.journal = journal
        self.clock = clock
        self._flush_handle: asyncio.TimerHandle | None = None
        self._failing: str | None = None  # the problem last reported, for the log
        self._unjournaled_ends: list[tuple[int, RunOutcome, float, str, str | None]] = []

    def event(
        self,
        disposition: Disposition | str,
        event: AlertEvent | None,
        *,
        model: str | None = None,
        run_id: int | None = None,
        detail: str = "",
        fingerprint: str | None = None,
    ) -> None:
        """A decision's event (the alert's fingerprint, else `fingerprint`)."""
        self.journal.add_event(
            str(disposition),
            now=self.clock(),
            model=model,
            fingerprint=event.fingerprint if event else fingerprint,
            run_id=run_id,
            detail=detail,
            defer=disposition in _DEFERRED,
        )
        if self.journal.pending:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Deferred journal writes reach the file within FLUSH_DELAY (other processes
        read it); readers in this process see them at once (reads flush first)."""
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        self._flush_handle = None
        try:
            self.journal.flush()
        except Exception:
            log.exception("journal flush failed")

    def close(self) -> None:
        """Write what is deferred now."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self.flush()

    def end_run(self, run_id: int, model: str, end: RunEnd, now: float) -> None:
        """Journal a run's end, after any the journal refused before; one it refuses now
        is kept for later (never raises JournalError)."""
        outcome, detail, next_action = end
        try:
            self._write_ends()
            self.journal.end_run(run_id, outcome, now, detail, next_action)
        except JournalError as exc:
            log.error(
                "could not journal the end of run %s (%s): %s",
                run_id,
                outcome,
                exc,
                extra={"model": model, "run_id": run_id},
            )
            self._unjournaled_ends.append((run_id, outcome, now, detail, next_action))

    def problem(self) -> str | None:
        """None when the journal records; else why not, and nothing may act. After a
        failed write one real write decides (the event saying it records again), so a
        freed disk is noticed by the next delivery; run ends it refused meanwhile are
        written then too. A file removed or replaced stays a problem: no write can fix it."""
        problem = self.journal.problem()
        if problem is None or problem == self.journal.write_failure:
            was = problem or self._failing
            if was is not None or self._unjournaled_ends:
                with contextlib.suppress(JournalError):
                    if was is not None:
                        self.journal.add_event(
                            "journal_recovered",
                            now=self.clock(),
                            detail=f"the journal records again; it had failed: {was}",
                        )
                    self._write_ends()
                problem = self.journal.problem()
        if problem != self._failing:
            if problem is None:
                log.warning("the journal records again")
            else:
                log.error("the journal cannot record, nothing acts until it can: %s", problem)
            self._failing = problem
        return problem

    def _write_ends(self) -> None:
        """Write the run ends a failing journal refused (JournalError if it still does)."""
        while self._unjournaled_ends:
            self.journal.end_run(*self._unjournaled_ends[0])
            self._unjournaled_ends.pop(0)
