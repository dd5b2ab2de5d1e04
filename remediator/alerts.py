"""What the engine is told about one alert: data only, taken from a validated
Alertmanager payload. Label values select an inventory entry and never reach a
shell or a path."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class AlertEvent:
    alertname: str
    status: AlertStatus
    fingerprint: str
    starts_at: datetime
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    receiver: str = ""
    group_key: str = ""
    # runbook_url, generator_url, external_url: bounded, kept with the run it starts (links.py)
    links: dict[str, str] = field(default_factory=dict)

    @property
    def dedupe_key(self) -> tuple[str, str]:
        """The same firing is the same (fingerprint, startsAt), however often it is delivered."""
        return (self.fingerprint, self.starts_at.isoformat())


@dataclass(frozen=True)
class InvalidAlert:
    """One alert of a delivery that cannot be acted on, and why. The rest of the delivery
    still counts: each invalid alert is journaled with its reason, never dropped silently.
    The fields are what could be read of it (bounded), for the journal and the answer."""

    index: int  # its place in the delivery's `alerts`
    reason: str  # names the field, e.g. "alerts[2].labels.model: ..."
    alertname: str = ""
    fingerprint: str = ""
    model: str = ""
    status: str = ""


class Disposition(StrEnum):
    """What the engine did with an alert; journaled and returned to the web layer."""

    STARTED = "started"  # a new run was queued for the model
    DUPLICATE = "duplicate"  # this firing already started (or is) a run
    ABSORBED = "absorbed"  # a run for the model is already queued or in progress
    RESOLVED = "resolved"  # resolved notification journaled (cancels a queued run)
    UNKNOWN_MODEL = "unknown_model"  # model not in the inventory: journaled, ignored
    UNROUTED = "unrouted"  # no playbook for this alert name: journaled, ignored
    PAUSED = "paused"  # automatic action paused (all or this model)
    CIRCUIT_OPEN = "circuit_open"  # budget spent or unfixable: escalated, waiting for resume
    BACKOFF = "backoff"  # within the budget's backoff: journaled, not started
    STALE = "stale"  # too old, or the playbook's re-check found it no longer holds (model up)
    INVALID = "invalid"  # the alert itself could not be read: journaled with the reason
