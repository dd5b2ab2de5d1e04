"""The journal: every run, step, decision and control in one SQLite file (WAL).

Why SQLite: the remediator, `mlx-medic log`, `pause` and `resume` are separate
processes that must see each other's writes at once (a pause reaches a running
service), and a crash must leave what was in flight visible. Commits are
`synchronous=FULL` (a power cut keeps what was committed).

The parts, one job each:
- `schema`: the tables, indexes and pragmas (what is on disk);
- `files`: the journal's files, their modes and group, and their identity;
- `store`: the connection, write transactions, deferred writes, JournalError, `problem()`;
- `writes`: runs, steps, events, firings, pauses and circuits as they happen;
- `reads`: the listings and answers read back, as the dataclasses of `views`;
- `decisions`: the recent decisions on-call reads, repeats folded (one read for all);
- `owner`: who runs a run (`host:pid`) and whether that process still lives;
- `retention`: the journal's bound: what a prune deletes, what it never does.
"""

from __future__ import annotations

from mlx_medic.remediator.journal.files import JOURNAL_DIR_MODE, JOURNAL_MODE
from mlx_medic.remediator.journal.owner import owner_tag
from mlx_medic.remediator.journal.reads import JournalReads
from mlx_medic.remediator.journal.store import JournalError
from mlx_medic.remediator.journal.views import (
    ControlView,
    DecisionView,
    EventView,
    RunView,
    StepView,
)
from mlx_medic.remediator.journal.writes import OUTPUT_CAP, JournalWrites


class Journal(JournalWrites, JournalReads):
    """One SQLite file shared by the service and the CLI. Calls are short and
    synchronous (microseconds), so asyncio code calls them directly."""


__all__ = [
    "JOURNAL_DIR_MODE",
    "JOURNAL_MODE",
    "OUTPUT_CAP",
    "ControlView",
    "DecisionView",
    "EventView",
    "Journal",
    "JournalError",
    "RunView",
    "StepView",
    "owner_tag",
]
