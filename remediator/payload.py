"""Alertmanager's webhook payload (version "4"), validated before anything acts on it.

Two levels, because Alertmanager does not retry 4xx: a body that is not an Alertmanager
payload at all (empty, not JSON, wrong version, no `alerts` list: 400; not sent as
application/json: 415) is refused whole with a reason a person can act on, whether
Alertmanager or someone with curl sent it; inside a payload each alert is read on its
own, so one bad alert (say, a rule that lost its `model` label) never loses the good
ones beside it: it becomes an InvalidAlert with its reason. A newer Alertmanager's extra
fields are tolerated, never trusted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, InvalidAlert
from mlx_medic.remediator.config import RoutingConfig
from mlx_medic.remediator.label_limits import bounded_labels
from mlx_medic.remediator.links import bounded_links

SUPPORTED_VERSION = "4"
EXPECTED_BODY = f'an Alertmanager webhook JSON payload (version "{SUPPORTED_VERSION}")'
JSON_CONTENT_TYPES = frozenset({"application/json"})
# JSON's names for what a body decoded to, as the sender wrote it (not Python's).
JSON_TYPE_NAMES: dict[type, str] = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}

# Label maps are str -> str: anything else (numbers, nulls, nested objects) is rejected.
StrMap = dict[StrictStr, StrictStr]
# Enough for any real fingerprint (AM sends 16 hex digits) and group key; bounded for the journal.
Short = Annotated[StrictStr, Field(max_length=1024)]


class PayloadError(ValueError):
    """The delivery cannot be used; the message is the rejection's reason, sent with
    `http_status`."""

    http_status = 400


class UnsupportedContentType(PayloadError):
    """The body is not sent as JSON: HTTP's 415 Unsupported Media Type, so a sender (or a
    person with curl) sees that the header is wrong, not the payload."""

    http_status = 415


class _Tolerant(BaseModel):
    # Newer Alertmanagers add fields (notification_reason, routeLabels...): ignore them.
    model_config = ConfigDict(extra="ignore", frozen=True)


class WebhookAlert(_Tolerant):
    status: Literal["firing", "resolved"]
    labels: StrMap
    annotations: StrMap = Field(default_factory=dict)
    startsAt: AwareDatetime  # Alertmanager's field names
    endsAt: AwareDatetime | None = None
    generatorURL: StrictStr = ""
    fingerprint: Annotated[StrictStr, Field(min_length=1, max_length=128)]


class WebhookPayload(_Tolerant):
    version: Literal["4"]
    groupKey: Short
    truncatedAlerts: StrictInt = Field(default=0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: Short
    groupLabels: StrMap = Field(default_factory=dict)
    commonLabels: StrMap = Field(default_factory=dict)
    commonAnnotations: StrMap = Field(default_factory=dict)
    externalURL: StrictStr = ""
    alerts: list[Any]  # each read on its own by to_events (WebhookAlert)


def _where(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


REASON_CAP = 1000  # characters: a reason is journaled, and label names come from the sender
FIELD_CAP = 200  # characters kept of a field read from an invalid alert


def _problems(exc: ValidationError, within: tuple[Any, ...] = ()) -> str:
    errors = exc.errors(include_url=False)
    parts = []
    for error in errors[:3]:
        message = error["msg"]
        if error["type"] == "missing":
            message = "required field is missing"
        parts.append(f"{_where((*within, *error['loc']))}: {message}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return ("; ".join(parts) + more)[:REASON_CAP]


def check_content_type(content_type: str) -> None:
    """Only JSON bodies; `content_type` is the media type without parameters, "" when the
    request has no Content-Type header."""
    if content_type.lower() not in JSON_CONTENT_TYPES:
        shown = content_type or "none (no Content-Type header)"
        raise UnsupportedContentType(f"content type must be application/json, got {shown}")


def parse_payload(body: bytes) -> WebhookPayload:
    """The validated payload, or PayloadError naming the first problems found."""
    if not body.strip():  # JSON's own error ("Expecting value") would not say why
        raise PayloadError(f"body is empty: expected {EXPECTED_BODY}")
    try:
        raw = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PayloadError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise PayloadError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise PayloadError("body is not valid JSON: nested too deeply") from exc
    if not isinstance(raw, dict):
        raise PayloadError(f"payload must be a JSON object, got {JSON_TYPE_NAMES[type(raw)]}")
    if "version" not in raw:
        raise PayloadError("invalid payload: version: required field is missing")
    version = raw["version"]
    if version != SUPPORTED_VERSION:
        raise PayloadError(
            f"unsupported payload version {json.dumps(version)[:40]};"
            f' this receiver speaks Alertmanager webhook version "{SUPPORTED_VERSION}"'
        )
    try:
        return WebhookPayload.model_validate(raw)
    except ValidationError as exc:
        raise PayloadError("invalid payload: " + _problems(exc)) from exc


def to_events(
    payload: WebhookPayload, routing: RoutingConfig | None = None
) -> list[AlertEvent | InvalidAlert]:
    """Each alert, in order: an AlertEvent, or an InvalidAlert saying why it cannot be
    acted on. A routed alert (its name has a playbook) must name its model: acting on
    it is impossible without, and a silent drop would hide a broken rule."""
    routing = routing or RoutingConfig()
    return [_read_alert(index, raw, payload, routing) for index, raw in enumerate(payload.alerts)]


def _read_alert(
    index: int, raw: Any, payload: WebhookPayload, routing: RoutingConfig
) -> AlertEvent | InvalidAlert:
    place = f"alerts[{index}]"
    try:
        alert = WebhookAlert.model_validate(raw)
    except ValidationError as exc:
        return _invalid(index, raw, routing, _problems(exc, ("alerts", index)))
    # Bounded before anything reads them (label_limits); routing reads the kept ones first.
    labels = bounded_labels(alert.labels, keep=("alertname", routing.model_label, "node"))
    alertname = labels.get("alertname")
    if not alertname:
        return _invalid(index, raw, routing, f"{place}.labels.alertname: required label is missing")
    if alertname in routing.playbooks and not labels.get(routing.model_label):
        return _invalid(
            index,
            raw,
            routing,
            f"{place}.labels.{routing.model_label}: alert {json.dumps(alertname)[:80]} needs"
            f" the {routing.model_label!r} label naming the model",
        )
    return AlertEvent(
        alertname=alertname,
        status=AlertStatus(alert.status),
        fingerprint=alert.fingerprint,
        starts_at=alert.startsAt,
        labels=labels,
        annotations=bounded_labels(alert.annotations, keep=()),
        receiver=payload.receiver,
        group_key=payload.groupKey,
        links=bounded_links(
            {
                "runbook_url": alert.annotations.get("runbook_url"),
                "generator_url": alert.generatorURL,
                "external_url": payload.externalURL,
            }
        ),
    )


def _invalid(index: int, raw: Any, routing: RoutingConfig, reason: str) -> InvalidAlert:
    """What could be read of a bad alert (strings only, bounded), and why it is bad."""
    alert: dict[str, Any] = raw if isinstance(raw, dict) else {}
    found = alert.get("labels")
    labels: dict[str, Any] = found if isinstance(found, dict) else {}

    def text(value: Any) -> str:
        return value[:FIELD_CAP] if isinstance(value, str) else ""

    return InvalidAlert(
        index=index,
        reason=reason,
        alertname=text(labels.get("alertname")),
        fingerprint=text(alert.get("fingerprint")),
        model=text(labels.get(routing.model_label)),
        status=text(alert.get("status")),
    )
