"""The remediator's HTTP face: Alertmanager's webhook, health, metrics, the on-call log.

`POST /alerts` answers within milliseconds: it validates, hands each alert to the
engine (which only decides and queues; playbooks run in the background) and
returns. Alertmanager retries 5xx and timeouts, so a slow answer would become
duplicate deliveries; 4xx is final, so it is kept for a body that is not an
Alertmanager payload at all, and says why. Inside a payload every alert gets its own
disposition: a bad one is journaled with its reason (`invalid`; past a delivery's first
few, the rest as one event) and the good ones act. The body is parsed off the event loop
and the loop turns between alerts, so /healthz and /metrics answer during a flood; how
many alerts one delivery and one second may bring is capped (delivery_limits: 503, which
Alertmanager retries, and the retry resumes where the last try stopped).
When the journal cannot record, the answer is 503 and nothing acts: Alertmanager
retries, and the page and /healthz say the journal is failing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mlx_medic.inventory.fields import parse_duration
from mlx_medic.remediator.alerts import AlertEvent, Disposition, InvalidAlert
from mlx_medic.remediator.auth import DECISION_KEY, CredentialStore, auth_middleware
from mlx_medic.remediator.config import ConfigSource, RemediatorConfig, RoutingConfig
from mlx_medic.remediator.control_state import (
    ControlsJournal,
    Hold,
    RecordLike,
    holds_as_dicts,
    read_holds,
)
from mlx_medic.remediator.delivery_limits import PER_DELIVERY, PER_SECOND, DeliveryLimits
from mlx_medic.remediator.journal import JournalError
from mlx_medic.remediator.oncall_page import render_page
from mlx_medic.remediator.payload import PayloadError, check_content_type, parse_payload, to_events

log = logging.getLogger("mlx_medic.remediator.web")

MAX_LIMIT = 500
INVALID_EACH = 5  # a delivery's first invalid alerts journaled each; the rest as one event
FOLDED_REASONS = 3  # reasons that one event quotes
TURN_SECONDS = 0.01  # the most a delivery holds the event loop between its turns


class EngineLike(Protocol):
    async def submit(self, event: AlertEvent) -> Disposition: ...

    def reject(self, invalid: InvalidAlert) -> Disposition: ...

    def journal_problem(self) -> str | None: ...

    def note(self, kind: str, detail: str) -> None: ...


class JournalLike(ControlsJournal, Protocol):
    """Read side of remediator.journal.Journal; `since` is a Unix time."""

    def list_runs(
        self, model: str | None = None, since: float | None = None, limit: int = 50
    ) -> Sequence[RecordLike]: ...

    def recent_decisions(
        self, model: str | None = None, since: float | None = None, limit: int = 25
    ) -> Sequence[RecordLike]: ...


ENGINE_KEY = web.AppKey("engine", EngineLike)
JOURNAL_KEY = web.AppKey("journal", JournalLike)
CONFIG_KEY = web.AppKey("config", RemediatorConfig)
REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)
# The config file the service was started with: the resume commands it shows name it.
CONFIG_SOURCE_KEY: web.AppKey[ConfigSource | None] = web.AppKey("config_source")


class AlertsReceived:
    """`mlx_medic_alerts_received_total{status}`. Plain integers, turned into a metric
    only when scraped: an alert storm should not pay for a lock per alert."""

    STATUSES = ("firing", "resolved", "invalid")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.STATUSES, 0)

    def inc(self, status: str) -> None:
        self.counts[status] += 1

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(
            "mlx_medic_alerts_received",
            "Alerts received on the webhook, by status;"
            " invalid counts alerts that could not be read and deliveries refused whole.",
            labels=["status"],
        )
        for status, count in self.counts.items():
            family.add_metric([status], count)
        return [family]


RECEIVED_KEY = web.AppKey("alerts_received", AlertsReceived)
LIMITS_KEY = web.AppKey("delivery_limits", DeliveryLimits)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _decide(request: web.Request, **fields: Any) -> None:
    """Remember what was decided, for the request's single log line."""
    request.setdefault(DECISION_KEY, {}).update(fields)


@web.middleware
async def decision_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One structured log line per request: what came in, what was decided, how fast."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        fields = {
            "method": request.method,
            "path": request.path,
            "status": status,
            "remote": request.remote,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            **request.get(DECISION_KEY, {}),
        }
        log.info("request", extra=fields)


def _reject(request: web.Request, status: int, reason: str) -> web.Response:
    request.app[RECEIVED_KEY].inc("invalid")
    _decide(request, reason=reason)
    return web.json_response({"status": "rejected", "reason": reason}, status=status)


def _unavailable(request: web.Request, problem: str) -> web.Response:
    """503: Alertmanager retries it, and nothing was done that the journal did not record."""
    reason = f"the journal cannot record, so nothing acts: {problem}"
    _decide(request, reason=reason)
    return web.json_response({"status": "unavailable", "reason": reason}, status=503)


async def _read_capped(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is larger than `limit` (declared or actual). The app's
    client_max_size is the same limit, so aiohttp stops reading at it."""
    if request.content_length is not None and request.content_length > limit:
        return None
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None


def _read_delivery(body: bytes, routing: RoutingConfig) -> list[AlertEvent | InvalidAlert]:
    return to_events(parse_payload(body), routing)


async def post_alerts(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    body = await _read_capped(request, config.max_body_bytes)
    if body is None:
        return _reject(request, 413, f"body larger than {config.max_body_bytes} bytes")
    # aiohttp reports a missing header as application/octet-stream; the sender sent none.
    sent_type = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    try:
        check_content_type(sent_type)
        # Off the event loop: 1 MiB is ~260,000 tiny alerts to validate, and /healthz and
        # /metrics answer meanwhile.
        alerts = await asyncio.to_thread(_read_delivery, body, config.routing)
    except PayloadError as exc:
        return _reject(request, exc.http_status, str(exc))

    engine = request.app[ENGINE_KEY]
    problem = engine.journal_problem()
    if problem is not None:
        return _unavailable(request, problem)
    limits = request.app[LIMITS_KEY]
    async with limits.lock:
        return await _take(request, alerts, limits.digest(body))


def _invalid_result(alert: InvalidAlert, disposition: Disposition) -> dict[str, Any]:
    return {
        "index": alert.index,
        "alertname": alert.alertname,
        "fingerprint": alert.fingerprint,
        "model": alert.model,
        "status": alert.status,
        "disposition": disposition.value,
        "reason": alert.reason,
    }


def _folded_detail(first: list[InvalidAlert], count: int, last_index: int) -> str:
    reasons = "; ".join(dict.fromkeys(alert.reason[:300] for alert in first))
    return (
        f"{count} more invalid alerts of this delivery (alerts[{first[0].index}] to"
        f" alerts[{last_index}]) are not acted on, journaled as this one event;"
        f" the first reasons: {reasons}"
    )


async def _take(
    request: web.Request, alerts: list[AlertEvent | InvalidAlert], digest: bytes
) -> web.Response:
    """Each alert in order, from where an earlier try of this body stopped, until the
    delivery ends or a limit (delivery_limits) stops it: then 503, and the retry resumes.
    A delivery's first INVALID_EACH invalid alerts are journaled each, the rest as one
    event, so a flood of empty alerts is not a flood of journal rows."""
    config, engine = request.app[CONFIG_KEY], request.app[ENGINE_KEY]
    received, limits = request.app[RECEIVED_KEY], request.app[LIMITS_KEY]
    start = limits.resume_at(digest)
    results: list[dict[str, Any]] = []
    folded: list[InvalidAlert] = []  # the first few, for their reasons
    folded_count = invalid_count = taken = last_folded = 0
    stopped_by: str | None = None
    reason = ""
    stop = len(alerts)
    try:
        turn = time.perf_counter()
        for index in range(start, len(alerts)):
            if time.perf_counter() - turn > TURN_SECONDS:
                await asyncio.sleep(0)  # /healthz and /metrics answer between alerts
                turn = time.perf_counter()
            alert = alerts[index]
            if isinstance(alert, InvalidAlert):
                received.inc("invalid")
                invalid_count += 1
                if invalid_count <= INVALID_EACH:
                    results.append(_invalid_result(alert, engine.reject(alert)))
                else:
                    folded_count += 1
                    if len(folded) < FOLDED_REASONS:
                        folded.append(alert)
                    last_folded = alert.index
                continue
            stopped_by = limits.limit_reached(taken)
            if stopped_by is not None:
                stop = index
                break
            received.inc(alert.status.value)
            disposition = await engine.submit(alert)
            if disposition is not Disposition.DUPLICATE:
                taken += 1
                limits.take()
            results.append(
                {
                    "index": index,
                    "alertname": alert.alertname,
                    "fingerprint": alert.fingerprint,
                    "model": alert.labels.get(config.routing.model_label, ""),
                    "status": alert.status.value,
                    "disposition": disposition.value,
                }
            )
        if folded:
            engine.note("invalid", _folded_detail(folded, folded_count, last_folded))
        if stopped_by is not None:
            reason = _deferral(limits, stopped_by, taken, stop, len(alerts))
            engine.note("deferred", reason)
    except JournalError as exc:
        # Whatever acted so far was journaled first (a run it started makes the retry a
        # repeat); nothing after the failed write acts, and the retry starts over.
        limits.forget(digest)
        _decide(request, dispositions=[r["disposition"] for r in results])
        return _unavailable(request, str(exc))
    _decide(
        request,
        alerts=len(alerts),
        dispositions=[r["disposition"] for r in results],
        fingerprints=[r["fingerprint"] for r in results][:20],
    )
    answer: dict[str, Any] = {"status": "accepted", "alerts": results}
    if folded_count:
        answer["invalid_folded"] = folded_count
    if stopped_by is None:
        limits.forget(digest)
        return web.json_response(answer, status=202)
    limits.remember(digest, stop)
    limits.deferred[stopped_by] += 1
    _decide(request, reason=reason)
    answer |= {"status": "deferred", "reason": reason, "resumes_at": stop}
    headers = {"Retry-After": str(limits.retry_after())} if stopped_by == PER_SECOND else None
    return web.json_response(answer, status=503, headers=headers)


def _deferral(limits: DeliveryLimits, limit: str, taken: int, stop: int, total: int) -> str:
    """Why the rest of a delivery waits for the retry, and what the sender can set."""
    left = f"alerts[{stop}] to alerts[{total - 1}] are left for Alertmanager's retry, which"
    if limit == PER_DELIVERY:
        return (
            f"{taken} new alerts taken, alerts_per_delivery={limits.per_delivery}: {left}"
            " resumes there; to send fewer per delivery set max_alerts in Alertmanager's"
            " webhook_config (it then drops the rest, counted in truncatedAlerts), or raise"
            " alerts_per_delivery in the remediator's config"
        )
    return (
        f"alerts_per_second={limits.per_second} reached after {taken} new alerts: {left}"
        " resumes there; raise alerts_per_second in the remediator's config to take more"
    )


async def get_healthz(request: web.Request) -> web.Response:
    """Unauthenticated: says whether the service can do its job, never the details."""
    if request.app[ENGINE_KEY].journal_problem() is not None:
        return web.json_response(
            {"status": "failing", "problem": "the journal cannot record; see the page"}, status=503
        )
    return web.json_response({"status": "ok"})


async def get_metrics(request: web.Request) -> web.Response:
    # Off the event loop: the pause and circuit series read the journal (ControlMetrics).
    data = await asyncio.to_thread(generate_latest, request.app[REGISTRY_KEY])
    response = web.Response(body=data)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


class QueryError(ValueError):
    pass


def parse_since(value: str, now: float) -> float:
    """`2h`/`90m`/`3600` ago, or an RFC 3339 time; a Unix time."""
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(
            f"since={value[:40]!r} is neither a duration (e.g. 2h) nor an RFC 3339 time"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def run_query(request: web.Request) -> dict[str, Any]:
    """model, since, limit from the query string, each checked."""
    query = request.query
    model = query.get("model") or None
    since = parse_since(query["since"], time.time()) if query.get("since") else None
    raw_limit = query.get("limit", "50")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise QueryError(f"limit={raw_limit[:20]!r} is not a whole number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit must be between 1 and {MAX_LIMIT}")
    return {"model": model, "since": since, "limit": limit}


async def _runs(request: web.Request) -> list[dict[str, Any]]:
    journal = request.app[JOURNAL_KEY]
    query = run_query(request)
    # SQLite reads are quick but blocking: keep them off the event loop.
    runs = await asyncio.to_thread(journal.list_runs, **query)
    return [run.to_dict() for run in runs]


async def _events(request: web.Request, limit: int | None = None) -> list[dict[str, Any]]:
    """Decisions (journal events), newest first, repeats folded (each with `count`,
    `first`, `last`) and those that need a person among them; `limit` defaults to the
    query's."""
    journal = request.app[JOURNAL_KEY]
    query = run_query(request)
    events = await asyncio.to_thread(
        journal.recent_decisions,
        model=query["model"],
        since=query["since"],
        limit=query["limit"] if limit is None else limit,
    )
    return [event.to_dict() for event in events]


async def _holds(request: web.Request) -> list[Hold]:
    """The pauses and open circuits holding the query's model (or any) back now."""
    return await asyncio.to_thread(
        read_holds,
        request.app[JOURNAL_KEY],
        request.query.get("model") or None,
        request.app[CONFIG_SOURCE_KEY],
    )


async def get_remediations(request: web.Request) -> web.Response:
    """Runs with their steps, the decisions (an invalid alert's reason among them), the
    pauses and open circuits holding automatic action back now, and `journal_problem`:
    null while the journal records, else why it cannot (nothing acts meanwhile)."""
    problem = request.app[ENGINE_KEY].journal_problem()
    try:
        runs = await _runs(request)
        decisions = await _events(request)
        holds = holds_as_dicts(await _holds(request))
    except QueryError as exc:
        _decide(request, reason=str(exc))
        return web.json_response({"status": "rejected", "reason": str(exc)}, status=400)
    except Exception as exc:
        if problem is None:
            raise
        log.warning("/api/remediations could not read the journal: %s", exc)
        runs, decisions, holds = [], [], holds_as_dicts([])  # the problem still says why
    return web.json_response(
        {"journal_problem": problem, "runs": runs, "decisions": decisions, **holds},
        dumps=_dumps,
    )


async def get_page(request: web.Request) -> web.Response:
    problem = request.app[ENGINE_KEY].journal_problem()
    try:
        runs = await _runs(request)
        events = await _events(request, limit=25)
        holds = await _holds(request)
    except QueryError as exc:
        _decide(request, reason=str(exc))
        return web.Response(text=str(exc), status=400)
    except Exception as exc:
        if problem is None:
            raise
        log.warning("the page could not read the journal: %s", exc)
        runs, events, holds = [], [], []  # the banner still says what is wrong
    html = render_page(
        runs,
        now=datetime.now(UTC),
        model=request.query.get("model") or None,
        events=events,
        journal_problem=problem,
        holds=holds,
    )
    return web.Response(
        text=html,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none';"
            " style-src 'unsafe-inline'; img-src 'none'",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


def make_app(
    engine: EngineLike,
    journal: JournalLike,
    config: RemediatorConfig,
    registry: CollectorRegistry,
    credentials: CredentialStore | None = None,
    config_source: ConfigSource | None = None,
) -> web.Application:
    """The application; `credentials` None serves without auth (the caller decided that),
    else its reload failures are served on /metrics; `config_source` is the config file
    the service runs with (None: none, or not said)."""
    app = web.Application(
        middlewares=[decision_log, auth_middleware(credentials)],
        # The webhook enforces its own cap (413); this bounds everything else.
        client_max_size=config.max_body_bytes,
    )
    app[ENGINE_KEY] = engine
    app[JOURNAL_KEY] = journal
    app[CONFIG_KEY] = config
    app[REGISTRY_KEY] = registry
    app[CONFIG_SOURCE_KEY] = config_source
    received = AlertsReceived()
    registry.register(received)  # type: ignore[arg-type]
    app[RECEIVED_KEY] = received
    if credentials is not None:
        registry.register(credentials)  # type: ignore[arg-type]
    limits = DeliveryLimits(config.alerts_per_delivery, config.alerts_per_second)
    registry.register(limits)  # type: ignore[arg-type]
    app[LIMITS_KEY] = limits
    app.router.add_post("/alerts", post_alerts)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/api/remediations", get_remediations)
    app.router.add_get("/", get_page)
    return app
