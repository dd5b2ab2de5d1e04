"""A daemon thread that runs one job now and then every `interval` seconds.

Some collectors must never do their work on the scrape path (a tmp walk over
hundreds of gigabytes, a model probe that may hang for its whole timeout):
they run it here and a scrape reads the last result. Only the first scrape
after start may wait, briefly, for the first cycle, so `--once` has values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("mlx_medic.exporter.background")


class PeriodicWorker:
    """Runs `work()` in a daemon thread named `name`, every `interval` s, until closed.

    `work` should handle its own errors; one that escapes is logged and the
    loop goes on, so a bad cycle never ends the background work.
    """

    def __init__(self, name: str, interval: float, work: Callable[[], None]):
        if interval <= 0:
            raise ValueError(f"the {name} interval must be positive, not {interval}")
        self.name = name
        self.interval = interval
        self.work = work
        self._first_cycle = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeriodicWorker:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def stopping(self) -> bool:
        """True once `close` was called: a long cycle may end early."""
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.work()
            except Exception:
                log.exception("%s: a background cycle failed", self.name)
            self._first_cycle.set()
            self._stop.wait(self.interval)

    def wait_first(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the first cycle to end; True if it has."""
        return self._first_cycle.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
