"""How much of one webhook delivery the remediator takes now, and what it leaves for
Alertmanager's retry.

A flood (a 1 MiB delivery of tiny alerts is ~260,000 of them) must not hold the event
loop or fill the journal. So at most `alerts_per_delivery` new alerts are taken from one
delivery, and at most `alerts_per_second` over all of them (a token bucket holding one
second's worth); the rest of the delivery is answered 503. Alertmanager retries any 5xx
and never a 4xx (notify/util.go, `Retrier.Check`: `retry := statusCode/100 == 5 || ...`,
prometheus/alertmanager 68fb2d5), with its own backoff (it reads no Retry-After). A retry
sends the same body, so the body's digest remembers how far the last try got: the retry
resumes after the alerts already taken (journaled, never taken twice) and the delivery
advances until it is whole. A different body starts from its first alert; what was
already handled is then a duplicate, which takes no part of the caps.

Alertmanager's webhook `max_alerts` truncates what it sends (webhook.go, `truncateAlerts`);
the truncated alerts are never sent, so the answer names it only as the sender's choice.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, Metric

PER_DELIVERY = "alerts_per_delivery"
PER_SECOND = "alerts_per_second"
REMEMBERED_DELIVERIES = 1024  # bodies whose progress is kept for their retry


class DeliveryLimits:
    """The caps, the token bucket, where each cut-short delivery's retry resumes, and
    `mlx_medic_deliveries_deferred_total{limit}`. `lock` makes deliveries take turns: the
    handler yields to the loop inside one (for /healthz), never to another delivery."""

    def __init__(
        self,
        per_delivery: int,
        per_second: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_delivery = per_delivery
        self.per_second = per_second
        self.clock = clock
        self.lock = asyncio.Lock()
        self._tokens = float(per_second)
        self._filled_at = clock()
        self._resume: OrderedDict[bytes, int] = OrderedDict()
        self.deferred = {PER_DELIVERY: 0, PER_SECOND: 0}

    @staticmethod
    def digest(body: bytes) -> bytes:
        return hashlib.blake2b(body, digest_size=16).digest()

    def resume_at(self, digest: bytes) -> int:
        """Index of the first alert an earlier try of this body did not take (0: none)."""
        return self._resume.get(digest, 0)

    def remember(self, digest: bytes, taken_up_to: int) -> None:
        """The body's alerts before `taken_up_to` are handled: its retry starts there."""
        self._resume[digest] = taken_up_to
        self._resume.move_to_end(digest)
        if len(self._resume) > REMEMBERED_DELIVERIES:
            self._resume.popitem(last=False)

    def forget(self, digest: bytes) -> None:
        self._resume.pop(digest, None)

    def limit_reached(self, taken: int) -> str | None:
        """The limit that stops this delivery before its next new alert, or None: then the
        alert may be taken (and `take` says it was)."""
        if self.per_delivery and taken >= self.per_delivery:
            return PER_DELIVERY
        if self.per_second:
            self._refill()
            if self._tokens < 1:
                return PER_SECOND
        return None

    def take(self) -> None:
        """One new alert was taken: it costs a token."""
        if self.per_second:
            self._tokens -= 1

    def retry_after(self) -> int:
        """Whole seconds until the bucket holds a delivery's worth (at least 1)."""
        if not self.per_second:
            return 1
        self._refill()
        wanted = min(self.per_delivery or self.per_second, self.per_second)
        return max(1, math.ceil((wanted - self._tokens) / self.per_second))

    def _refill(self) -> None:
        now = self.clock()
        elapsed, self._filled_at = max(0.0, now - self._filled_at), now
        self._tokens = min(float(self.per_second), self._tokens + elapsed * self.per_second)

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(
            "mlx_medic_deliveries_deferred",
            "Webhook deliveries answered 503 with alerts left for Alertmanager's retry,"
            " by the limit reached (alerts_per_delivery, alerts_per_second).",
            labels=["limit"],
        )
        for limit, count in self.deferred.items():
            family.add_metric([limit], count)
        return [family]
