"""What holds automatic action back now: the pauses and open circuits in the journal.

`mlx-medic pause` and `resume` write them from another process, so every reader asks the
journal when it shows them (Journal.controls, what `mlx-medic log` lists first), never a
copy in memory: the page's banner, `/api/remediations` and the `/metrics` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mlx_medic.remediator.config import ConfigSource, resume_command
from mlx_medic.remediator.journal import ControlView
from mlx_medic.remediator.utc_time import iso_utc

# The escalation that opened a circuit is journaled with it; later ones of the model (a
# playbook with its own budget escalates without opening it) are few, so this many suffice.
OPENER_SCAN = 100


class RecordLike(Protocol):
    """A journal run or event view."""

    def to_dict(self) -> dict[str, Any]: ...


class EventsJournal(Protocol):
    """The journal's event read (remediator.journal.Journal has it); `since` is a Unix
    time."""

    def list_events(
        self,
        model: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        limit: int = 100,
    ) -> Sequence[RecordLike]: ...


class ControlsJournal(EventsJournal, Protocol):
    """The journal reads this module needs: the controls, and the events."""

    def controls(self) -> Sequence[ControlView]: ...


def concerning(controls: Iterable[ControlView], model: str | None) -> list[ControlView]:
    """Those that hold `model` back: a pause of all models, its own pause, its circuit;
    every one when `model` is None."""
    return [c for c in controls if model is None or c.model in (None, model)]


def opening_run(journal: ControlsJournal, circuit: ControlView) -> int | None:
    """The run whose escalation opened `circuit` (journaled at the same moment), or None
    when no run did (an escalation outside a run) or its event is gone."""
    events = journal.list_events(
        model=circuit.model, since=circuit.since, kind="escalation", limit=OPENER_SCAN
    )
    openers = [e.to_dict() for e in events]
    opened = iso_utc(circuit.since)  # as `to_dict` gives an event's time
    opener = next((e for e in reversed(openers) if e.get("time") == opened), None)
    run_id = opener.get("run_id") if opener else None
    return int(run_id) if run_id is not None else None


@dataclass(frozen=True)
class Hold:
    """A pause or open circuit as on-call sees it: what, since when, why, by whom, the
    run that opened a circuit, and the command that lifts it."""

    control: ControlView
    run_id: int | None
    resume: str

    @property
    def is_pause(self) -> bool:
        return self.control.kind == "pause"

    def to_dict(self) -> dict[str, Any]:
        """`mlx-medic log --json`'s control fields, with `resume` (and a circuit's `run_id`)."""
        extra = {} if self.is_pause else {"run_id": self.run_id}
        return {**self.control.to_dict(), **extra, "resume": self.resume}


def read_holds(
    journal: ControlsJournal, model: str | None, source: ConfigSource | None
) -> list[Hold]:
    """The pauses and open circuits holding `model` (None: any) back, oldest first;
    `source` is the service's config, which the resume command names."""
    return [
        Hold(
            control,
            None if control.kind == "pause" else opening_run(journal, control),
            resume_command(source, control.model),
        )
        for control in concerning(journal.controls(), model)
    ]


@dataclass(frozen=True)
class ModelHold:
    """Since when (Unix time) a model is paused and its circuit open; None: it is not."""

    paused_since: float | None = None
    circuit_since: float | None = None


def model_holds(controls: Iterable[ControlView], models: Iterable[str]) -> dict[str, ModelHold]:
    """Each of `models`: paused by the pause of all models or its own (the older one's
    time: how long nothing has acted), and its circuit. A control of a name not in
    `models` holds none of them back and is left out."""
    paused: dict[str | None, float] = {}
    circuits: dict[str | None, float] = {}
    for control in controls:
        (paused if control.kind == "pause" else circuits)[control.model] = control.since
    held = {}
    for model in models:
        pauses = [paused[k] for k in (None, model) if k in paused]
        held[model] = ModelHold(min(pauses) if pauses else None, circuits.get(model))
    return held


def holds_as_dicts(holds: Iterable[Hold]) -> Mapping[str, list[dict[str, Any]]]:
    """`pauses` and `circuits` for `/api/remediations`."""
    holds = list(holds)
    return {
        "pauses": [h.to_dict() for h in holds if h.is_pause],
        "circuits": [h.to_dict() for h in holds if not h.is_pause],
    }
