"""The wrapper's own restart policy: after a crash it launches again at once instead of
exiting into the service manager's restart throttle (launchd spawns a job at most once
every 10 s by default), within a budget and an interval, so a crash loop launches (and
spends protection domains) no faster than one under KeepAlive."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class Relaunches:
    """At most `limit` relaunches per `window` seconds; launches `interval` apart."""

    def __init__(
        self,
        limit: int,
        window: float,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit, self.window, self.interval, self.clock = limit, window, interval, clock
        self._times: deque[float] = deque()

    def _prune(self) -> None:
        now = self.clock()
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()

    @property
    def used(self) -> int:
        self._prune()
        return len(self._times)

    def allow(self) -> bool:
        return self.used < self.limit

    def record(self) -> None:
        self._times.append(self.clock())

    def not_before(self, launched_at: float | None) -> float:
        """When the next launch may start: `interval` after the last one started."""
        return 0.0 if launched_at is None else launched_at + self.interval
