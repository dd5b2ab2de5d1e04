"""Recent decisions as on-call reads them (`mlx-medic log`, `/`, `/api/remediations`):
repeats folded into one entry with a count, and every decision that needs a person.

A storm of repeats is thousands of events a minute; read as "the latest N events" it
pushed out everything else. So the events are read in two parts, each with its own
index (see schema.py), each bounded by `limit`:

- Decisions that need a person (NEEDS_A_PERSON): queried on their own however many
  events came after them; identical ones (same kind, model and detail) are one entry.
- The others: each model's decisions newest first, where a run of REPEATS of one kind
  for one model (e.g. `absorbed`: "run 12 is already queued", 3,000 times) is one entry
  until another decision for that model (e.g. `started`) ends the run, and consecutive
  identical decisions of the other kinds are one entry too. The read covers the latest
  `limit` of those other decisions and, per model in them, back to its previous one,
  so a fold's count is whole.

Each entry is the newest event of its fold with `count`, `first` and `last` (times).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from sqlite3 import Row
from typing import Any

from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.journal.views import DecisionView, decision_view

# Decisions that only a person can act on: an alert nobody routes or can read or whose
# model is not in the inventory (a broken rule or inventory: nothing will ever act on
# it), and a model whose circuit is open (escalated; it waits for `mlx-medic resume`).
NEEDS_A_PERSON = (
    Disposition.UNKNOWN_MODEL,
    Disposition.UNROUTED,
    Disposition.INVALID,
    Disposition.CIRCUIT_OPEN,
    "escalation",
)
# Decisions that recur for every delivery while a state holds (a run in flight, a
# firing handled, a pause, a backoff): folded per model and kind.
REPEATS = (
    Disposition.DUPLICATE,
    Disposition.ABSORBED,
    Disposition.PAUSED,
    Disposition.BACKOFF,
    Disposition.STALE,
)


def _sql_list(kinds: Sequence[str]) -> str:
    """A literal `'a','b'` (partial indexes need their condition spelled out)."""
    return ",".join(f"'{kind}'" for kind in kinds)


# The condition of each partial index, repeated word for word by the queries using it.
NEEDS_SQL = f"kind IN ({_sql_list(NEEDS_A_PERSON)})"
LANDMARK_SQL = f"kind NOT IN ({_sql_list((*NEEDS_A_PERSON, *REPEATS))})"
REPEATS_SQL = f"kind IN ({_sql_list(REPEATS)})"

_NEWER = 2**63 - 1  # above every event's id
Query = Callable[[str, Sequence[Any]], list[Row]]


# Each kind of repeat of model ?1 between events ?2 and ?3 (from time ?4 on): how many,
# the newest, the oldest's time. Counting alone walks the index (model, kind, id, time)
# fastest; the newest and the oldest are one seek each.
_REPEAT_ROWS = ",".join(f"('{kind}')" for kind in REPEATS)
_IN_RANGE = "FROM events WHERE model IS ?1 AND kind=repeats.kind AND id>?2 AND id<?3{since}"
FOLDS_BETWEEN = (
    f"SELECT (SELECT count(*) {_IN_RANGE}) AS count,"
    f" (SELECT max(id) {_IN_RANGE}) AS last_id,"
    f" (SELECT time {_IN_RANGE} ORDER BY id LIMIT 1) AS first"
    f" FROM (SELECT column1 AS kind FROM (VALUES {_REPEAT_ROWS}))"
    " AS repeats"
)


@dataclass(frozen=True)
class Fold:
    """A fold's newest event (its id), how many it holds and the time of its oldest."""

    last_id: int
    count: int
    first: float


def recent_decisions(
    query: Query, model: str | None, since: float | None, limit: int
) -> list[DecisionView]:
    """Newest first: at most `limit` folded entries needing a person and at most `limit`
    others; `model` and `since` (a Unix time) narrow both."""
    limit = max(0, int(limit))
    since_sql, since_params = ("", []) if since is None else (" AND time>=?", [since])
    model_sql, model_params = ("", []) if model is None else (" AND model=?", [model])
    needs = query(
        "SELECT max(id) AS last_id, count(*) AS count, min(time) AS first FROM events"
        f" WHERE {NEEDS_SQL}{model_sql}{since_sql} GROUP BY kind, model, detail"
        " ORDER BY last_id DESC LIMIT ?",
        [*model_params, *since_params, limit],
    )
    folds = [Fold(int(r["last_id"]), int(r["count"]), float(r["first"])) for r in needs]
    folds += _other_folds(query, model, (since_sql, since_params), limit)
    if not folds:
        return []
    by_id = {f.last_id: f for f in folds}
    marks = ",".join("?" * len(by_id))
    rows = query(f"SELECT * FROM events WHERE id IN ({marks})", list(by_id))
    views = [decision_view(r, by_id[r["id"]].count, by_id[r["id"]].first) for r in rows]
    return sorted(views, key=lambda v: v.id, reverse=True)


def _other_folds(
    query: Query, model: str | None, since: tuple[str, list[Any]], limit: int
) -> list[Fold]:
    """The newest `limit` folds of the decisions that need no person. Those that are no
    repeat ("landmarks": started, resolved, a person's pause...) come from their own
    index; between two landmarks of a model that differ, each kind of repeat is one fold,
    counted in the index on (model, kind, id, time): a storm costs an index range."""
    since_sql, since_params = since
    model_sql, model_params = ("", []) if model is None else (" AND model=?", [model])
    marks = query(
        "SELECT id, time, kind, model, detail FROM events INDEXED BY events_landmarks"
        f" WHERE {LANDMARK_SQL}{model_sql}{since_sql} ORDER BY id DESC LIMIT ?",
        [*model_params, *since_params, limit],
    )
    # Landmarks older than the limit-th are not shown, but a fold of repeats after one is.
    start = int(marks[-1]["id"]) if limit and len(marks) == limit else 0
    folds: list[Fold] = []
    for name in [model] if model is not None else _models(query):
        own = [m for m in reversed(marks) if m["model"] == name]  # oldest first
        if not own and not query(
            f"SELECT 1 FROM events WHERE model IS ? AND {REPEATS_SQL} AND id>=? LIMIT 1",
            [name, start],
        ):
            continue  # nothing of this model in the window
        before = query(
            f"SELECT id FROM events WHERE model IS ? AND id<? AND {LANDMARK_SQL}"
            " ORDER BY id DESC LIMIT 1",
            [name, own[0]["id"] if own else _NEWER],
        )
        edges = [int(before[0]["id"]) if before else 0]
        previous: Row | None = None
        for mark in own:  # identical landmarks in a row: one fold, one edge
            if previous is not None and _same(previous, mark):
                folds[-1] = Fold(int(mark["id"]), folds[-1].count + 1, folds[-1].first)
            else:
                edges.append(int(mark["id"]))
                folds.append(Fold(int(mark["id"]), 1, float(mark["time"])))
            previous = mark
        edges.append(_NEWER)
        for low, high in itertools.pairwise(edges):
            rows = query(
                FOLDS_BETWEEN.format(since=" AND time>=?4" if since_params else ""),
                [name, low, high, *since_params],
            )
            folds += [
                Fold(int(r["last_id"]), int(r["count"]), float(r["first"]))
                for r in rows
                if r["count"]
            ]
    return sorted(folds, key=lambda f: f.last_id, reverse=True)[:limit]


def _same(a: Row, b: Row) -> bool:
    return bool(a["kind"] == b["kind"] and a["detail"] == b["detail"])


def _models(query: Query) -> list[str | None]:
    """Every model the events name, and None (events of no model): one index seek each
    (a loose scan of the index on model), however many events there are."""
    rows = query(
        "WITH RECURSIVE names(model) AS (SELECT min(model) FROM events UNION ALL"
        " SELECT (SELECT min(model) FROM events WHERE model>names.model) FROM names"
        " WHERE names.model IS NOT NULL) SELECT model FROM names WHERE model IS NOT NULL",
        [],
    )
    return [None, *(str(r["model"]) for r in rows)]
