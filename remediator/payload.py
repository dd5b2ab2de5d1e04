"""Alertmanager's webhook payload (version "4"), validated before anything acts on it.

Alertmanager does not retry 4xx, so every rejection carries a reason a person can
act on; a newer Alertmanager's extra fields are tolerated, never trusted.
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

from mlx_medic.remediator.alerts import AlertEvent, AlertStatus
from mlx_medic.remediator.config import RoutingConfig

SUPPORTED_VERSION = "4"
JSON_CONTENT_TYPES = frozenset({"application/json"})

# Label maps are str -> str: anything else (numbers, nulls, nested objects) is rejected.
StrMap = dict[StrictStr, StrictStr]
# Enough for any real fingerprint (AM sends 16 hex digits) and group key; bounded for the journal.
Short = Annotated[StrictStr, Field(max_length=1024)]


class PayloadError(ValueError):
    """The payload cannot be used; the message is the 400 response's reason."""


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
    alerts: list[WebhookAlert]


def _where(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    parts = []
    for error in errors[:3]:
        message = error["msg"]
        if error["type"] == "missing":
            message = "required field is missing"
        parts.append(f"{_where(error['loc'])}: {message}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "invalid payload: " + "; ".join(parts) + more


def check_content_type(content_type: str) -> None:
    """Only JSON bodies; `content_type` is the media type without parameters."""
    if content_type.lower() not in JSON_CONTENT_TYPES:
        shown = content_type or "none"
        raise PayloadError(f"content type must be application/json, got {shown}")


def parse_payload(body: bytes) -> WebhookPayload:
    """The validated payload, or PayloadError naming the first problems found."""
    try:
        raw = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PayloadError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise PayloadError(f"body is not valid JSON: {exc.msg} at line {exc.lineno}"
                           f" column {exc.colno}") from exc
    except RecursionError as exc:
        raise PayloadError("body is not valid JSON: nested too deeply") from exc
    if not isinstance(raw, dict):
        raise PayloadError(f"payload must be a JSON object, got {type(raw).__name__}")
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
        raise PayloadError(_reason(exc)) from exc


def to_events(payload: WebhookPayload, routing: RoutingConfig | None = None) -> list[AlertEvent]:
    """One AlertEvent per alert. A routed alert (its name has a playbook) must name its
    model, else the whole delivery is refused: a silent drop would hide a broken rule."""
    routing = routing or RoutingConfig()
    events = []
    for index, alert in enumerate(payload.alerts):
        alertname = alert.labels.get("alertname")
        if not alertname:
            raise PayloadError(f"invalid payload: alerts[{index}].labels.alertname:"
                               " required label is missing")
        if alertname in routing.playbooks and not alert.labels.get(routing.model_label):
            raise PayloadError(
                f"invalid payload: alerts[{index}].labels.{routing.model_label}: alert"
                f" {json.dumps(alertname)[:80]} needs the {routing.model_label!r} label"
                " naming the model"
            )
        events.append(
            AlertEvent(
                alertname=alertname,
                status=AlertStatus(alert.status),
                fingerprint=alert.fingerprint,
                starts_at=alert.startsAt,
                labels=dict(alert.labels),
                annotations=dict(alert.annotations),
                receiver=payload.receiver,
                group_key=payload.groupKey,
            )
        )
    return events
