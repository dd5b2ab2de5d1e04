"""The remediator's HTTP face: Alertmanager's webhook, health, metrics, the on-call log.

`POST /alerts` answers within milliseconds: it validates, hands each alert to the
engine (which only decides and queues; playbooks run in the background) and
returns. Alertmanager retries 5xx and timeouts, so a slow answer would become
duplicate deliveries; 4xx is final, so it is kept for a body that is not an
Alertmanager payload at all, and says why. Inside a payload every alert gets its own
disposition: a bad one is journaled with its reason (`invalid`) and the good ones act.
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
from mlx_medic.remediator.config import ConfigSource, RemediatorConfig
from mlx_medic.remediator.control_state import (
    ControlsJournal,
    Hold,
    RecordLike,
    holds_as_dicts,
    read_holds,
)
from mlx_medic.remediator.journal import JournalError
from mlx_medic.remediator.oncall_page import render_page
from mlx_medic.remediator.payload import PayloadError, check_content_type, parse_payload, to_events

log = logging.getLogger("mlx_medic.remediator.web")

MAX_LIMIT = 500


class EngineLike(Protocol):
    async def submit(self, event: AlertEvent) -> Disposition: ...

    def reject(self, invalid: InvalidAlert) -> Disposition: ...

    def journal_problem(self) -> str | None: ...


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


async def post_alerts(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    body = await _read_capped(request, config.max_body_bytes)
    if body is None:
        return _reject(request, 413, f"body larger than {config.max_body_bytes} bytes")
    # aiohttp reports a missing header as application/octet-stream; the sender sent none.
    sent_type = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    try:
        check_content_type(sent_type)
        alerts = to_events(parse_payload(body), config.routing)
    except PayloadError as exc:
        return _reject(request, exc.http_status, str(exc))

    engine = request.app[ENGINE_KEY]
    problem = engine.journal_problem()
    if problem is not None:
        return _unavailable(request, problem)
    received = request.app[RECEIVED_KEY]
    results: list[dict[str, Any]] = []
    try:
        for index, alert in enumerate(alerts):
            if isinstance(alert, InvalidAlert):
                received.inc("invalid")
                disposition = engine.reject(alert)
                results.append(
                    {
                        "index": index,
                        "alertname": alert.alertname,
                        "fingerprint": alert.fingerprint,
                        "model": alert.model,
                        "status": alert.status,
                        "disposition": disposition.value,
                        "reason": alert.reason,
                    }
                )
                continue
            received.inc(alert.status.value)
            disposition = await engine.submit(alert)
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
    except JournalError as exc:
        # Whatever acted so far was journaled first (a run it started makes the retry a
        # repeat); nothing after the failed write acts.
        _decide(request, dispositions=[r["disposition"] for r in results])
        return _unavailable(request, str(exc))
    _decide(
        request,
        alerts=len(alerts),
        dispositions=[r["disposition"] for r in results],
        fingerprints=[r["fingerprint"] for r in results][:20],
    )
    return web.json_response({"status": "accepted", "alerts": results}, status=202)


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
    """Runs with their steps, the decisions (an invalid alert's reason among them), and
    the pauses and open circuits holding automatic action back now."""
    try:
        runs = await _runs(request)
        decisions = await _events(request)
    except QueryError as exc:
        _decide(request, reason=str(exc))
        return web.json_response({"status": "rejected", "reason": str(exc)}, status=400)
    holds = holds_as_dicts(await _holds(request))
    return web.json_response({"runs": runs, "decisions": decisions, **holds}, dumps=_dumps)


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
    app.router.add_post("/alerts", post_alerts)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/api/remediations", get_remediations)
    app.router.add_get("/", get_page)
    return app
