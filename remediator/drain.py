"""A node's drain, as `mlx-medic drain NODE` and `mlx-medic undrain NODE` keep it: a
journal event per drain and per undrain (the newest of a node's says whether it is
drained), and the Alertmanager silences a drain made.

Why in the journal: the remediator's replicas, `mlx-medic log` and the /metrics series
(`mlx_medic_node_drained_since_timestamp_seconds`, for the alert on a drain left open)
read the same file, and the node itself may be rebooting. The drain keeps the node's boot
id as the drain saw it, so undrain can tell whether the node has rebooted since.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_medic.remediator.control_state import EventsJournal
from mlx_medic.remediator.utc_time import iso_utc

DRAIN_EVENT = "drain"
UNDRAIN_EVENT = "undrain"
DRAIN_DATA = "drain: "  # in a drain event's detail, before its JSON
SCAN = 10_000  # drain and undrain events read to find the open drains


@dataclass(frozen=True)
class DrainRecord:
    """One drain: the node, its boot id when drained, the models it stopped (and those
    whose stop did not succeed), the silences made (their Alertmanager), who and when."""

    node: str
    boot_id: str
    models: tuple[str, ...]
    by: str
    since: float
    silences: tuple[str, ...] = ()
    alertmanager: str | None = None
    not_stopped: tuple[str, ...] = field(default=())

    def to_detail(self) -> str:
        """The event's detail: a sentence for people, then the record's JSON."""
        stopped = ", ".join(self.models) or "no model"
        silenced = f"; silences {', '.join(self.silences)}" if self.silences else ""
        failed = f"; NOT stopped: {', '.join(self.not_stopped)}" if self.not_stopped else ""
        data = json.dumps(asdict(self), sort_keys=True)
        return (
            f"{self.node} drained by {self.by} (boot {self.boot_id}): paused and stopped"
            f" {stopped}{failed}{silenced}. {DRAIN_DATA}{data}"
        )

    @classmethod
    def parse(cls, detail: str) -> DrainRecord:
        """The record in a drain event's detail; ValueError when it carries none."""
        try:
            data = json.loads(detail.partition(DRAIN_DATA)[2])
            return cls(
                node=str(data["node"]),
                boot_id=str(data["boot_id"]),
                models=tuple(str(m) for m in data["models"]),
                by=str(data["by"]),
                since=float(data["since"]),
                silences=tuple(str(s) for s in data.get("silences", ())),
                alertmanager=data.get("alertmanager"),
                not_stopped=tuple(str(m) for m in data.get("not_stopped", ())),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"no drain record in {detail!r}: {exc}") from None


def undrain_detail(node: str, said: str) -> str:
    """An undrain event's detail; its first word is the node, which ends the drain."""
    return f"{node} undrained: {said}"


def open_drains(journal: EventsJournal) -> dict[str, DrainRecord]:
    """Each drained node's drain: its newest drain event has no undrain event after it."""
    events = [
        *journal.list_events(kind=DRAIN_EVENT, limit=SCAN),
        *journal.list_events(kind=UNDRAIN_EVENT, limit=SCAN),
    ]
    drains: dict[str, DrainRecord] = {}
    for event in sorted((e.to_dict() for e in events), key=lambda e: int(e["id"])):
        detail = str(event["detail"])
        if event["kind"] == UNDRAIN_EVENT:
            drains.pop(detail.split(" ", 1)[0], None)
            continue
        try:
            record = DrainRecord.parse(detail)
        except ValueError:
            continue  # written by hand, or cut short: no drain to end
        drains[record.node] = record
    return drains


# --- Alertmanager's v2 API ----------------------------------------------------------------


class SilenceError(Exception):
    """Alertmanager could not be asked, or refused; the message says which and why."""


def _request(url: str, method: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        said = exc.read().decode(errors="replace").strip()[:300]
        raise SilenceError(f"{method} {url}: HTTP {exc.code}: {said}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SilenceError(f"{method} {url}: {exc}") from None
    return json.loads(text) if text.strip() else None


def create_silence(
    alertmanager: str, label: str, value: str, *, now: float, ends: float, by: str, comment: str
) -> str:
    """A silence of every alert whose `label` is `value`, from now until `ends` (it
    expires by itself then); its id."""
    body = {
        "matchers": [{"name": label, "value": value, "isRegex": False, "isEqual": True}],
        "startsAt": iso_utc(now),
        "endsAt": iso_utc(ends),
        "createdBy": by,
        "comment": comment,
    }
    answer = _request(f"{alertmanager.rstrip('/')}/api/v2/silences", "POST", body)
    if not isinstance(answer, dict) or not isinstance(answer.get("silenceID"), str):
        raise SilenceError(f"{alertmanager}: no silenceID in {answer!r}")
    return str(answer["silenceID"])


def expire_silence(alertmanager: str, silence_id: str) -> None:
    """End the silence now (Alertmanager keeps it, expired)."""
    quoted = urllib.parse.quote(silence_id, safe="")
    _request(f"{alertmanager.rstrip('/')}/api/v2/silence/{quoted}", "DELETE")


def silence_state(alertmanager: str, silence_id: str) -> str:
    """`active`, `pending` or `expired`, as Alertmanager says."""
    quoted = urllib.parse.quote(silence_id, safe="")
    answer = _request(f"{alertmanager.rstrip('/')}/api/v2/silence/{quoted}", "GET")
    return str(answer["status"]["state"])
