"""What a journal read returns: runs with their steps, events and controls as plain
dataclasses (what the on-call page, `/api/remediations` and `mlx-medic log` show, via
`to_dict`: times in ISO 8601 UTC, durations in `duration_seconds`), and how a row of
the journal becomes one."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from mlx_medic.remediator.label_limits import bounded_labels
from mlx_medic.remediator.links import bounded_links, split_links
from mlx_medic.remediator.utc_time import iso_utc, iso_utc_or_none


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
    condition: str | None = None  # when it runs, if not always: "only if ..."

    @property
    def duration(self) -> float | None:
        """None for a step that did not run (planned by a dry run; an older journal gave
        it an end at its start)."""
        if self.ended_at is None or self.outcome == "planned":  # StepOutcome.PLANNED
            return None
        return self.ended_at - self.started_at

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "started_at": iso_utc(self.started_at),
            "ended_at": iso_utc_or_none(self.ended_at),
            "duration_seconds": self.duration,
        }


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
    # the alert's runbook_url, generator_url, external_url as sent (bounded; links.py)
    links: dict[str, str] = field(default_factory=dict)
    steps: list[StepView] = field(default_factory=list)
    # why it acted: its re-check's verdict, what was probed, from where (None: not yet)
    recheck: str | None = None

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
        # `links` only what may be a link (an http or https URL); the rest shown as text
        data["links"], data["unsafe_links"] = split_links(self.links)
        data["queued_at"] = iso_utc(self.queued_at)
        data["started_at"] = iso_utc_or_none(self.started_at)
        data["ended_at"] = iso_utc_or_none(self.ended_at)
        data["duration_seconds"] = self.duration
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
        return {**asdict(self), "time": iso_utc(self.time)}


@dataclass
class DecisionView(EventView):
    """A decision as on-call reads it: the newest event of a fold of `count` (journal's
    decisions.py), from `first` to `last` (= `time`)."""

    count: int = 1
    first: float = 0.0

    @property
    def last(self) -> float:
        return self.time

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "count": self.count,
            "first": iso_utc(self.first),
            "last": iso_utc(self.last),
        }


@dataclass
class ControlView:
    kind: str  # 'pause' | 'circuit'
    model: str | None  # None: every model
    reason: str
    next_action: str | None
    by_whom: str
    since: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "since": iso_utc(self.since)}


def run_view(r: sqlite3.Row) -> RunView:
    """A row of `runs`, without its steps (the reader adds them); its labels bounded, as
    an older version may have stored them whole, and its links."""
    labels = _loads(r["labels"], {})
    columns = r.keys()  # a journal read-only before it had links (`log --journal`): none
    return _from_row(
        RunView,
        r,
        labels=bounded_labels(labels) if isinstance(labels, dict) else {},
        links=bounded_links(_loads(r["links"] if "links" in columns else None, {})),
        dry_run=bool(r["dry_run"]),
        counted=bool(r["counted"]),
    )


def step_view(r: sqlite3.Row) -> StepView:
    return _from_row(
        StepView, r, command=_loads(r["command"], None), targets=_loads(r["targets"], [])
    )


def event_view(r: sqlite3.Row) -> EventView:
    return _from_row(EventView, r)


def decision_view(r: sqlite3.Row, count: int, first: float) -> DecisionView:
    return _from_row(DecisionView, r, count=int(count), first=float(first))


def control_view(r: sqlite3.Row) -> ControlView:
    return _from_row(ControlView, r)


_View = TypeVar("_View", RunView, StepView, EventView, DecisionView, ControlView)


def _from_row(view: type[_View], row: sqlite3.Row, **decoded: Any) -> _View:
    """A `view` of the row: each field the column of its name as stored, or its value
    in `decoded` (JSON, flags); a field no column has (a run's steps) keeps its default."""
    columns = set(row.keys())
    stored = {f.name: row[f.name] for f in fields(view) if f.name in columns}
    return view(**{**stored, **decoded})


def _loads(text: str | None, default: Any) -> Any:
    """A JSON column's value; `default` for NULL or for text that is not JSON, so one
    bad value does not break a listing."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default
