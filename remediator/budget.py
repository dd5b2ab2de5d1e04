"""The restart budget, its backoff, and the circuit breaker with escalation.

Why: a restart cannot fix every failure, and each failed JACCL start can spend a
protection domain that only a reboot returns. So automatic action is bounded:
at most `policy.restart_budget` runs per `policy.window`, `policy.backoff * 2^k`
apart. When the budget is spent, or a run ends where a restart cannot help, the
model's circuit opens (in the journal, so it survives restarts and the CLI sees
it) and a person is told exactly what to do next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from mlx_medic.inventory.model import Model
from mlx_medic.remediator.config import ConfigSource, resume_command
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.outcomes import EscalationReason

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT = 5.0


def human_duration(seconds: float) -> str:
    seconds = float(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds >= 120:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:g}s"


def resume_hint(model: str, source: ConfigSource | None = None) -> str:
    """The last words of an escalation's next action: the resume that lets automatic action
    at `model` again, with the service's `--config.file` when it is not the default."""
    return f"then `{resume_command(source, model)}`"


@dataclass(frozen=True)
class BudgetDecision:
    allowed: bool
    spent: bool  # no budget left in the window: open the circuit
    retry_after: float  # seconds left of the backoff (0 when allowed or spent)
    runs_in_window: int
    reason: str


class Budget:
    """Counts the runs that acted on a model (journal `counted`), within its window
    and after the last manual resume.

    The window is wall time (`clock`), as the journal persists it across restarts: a jump
    forward past the window ages its runs out, a jump back keeps them in it longer. The
    backoff is never longer than configured: when the last run lies in the wall clock's
    future (the clock was set back), its backoff is measured on `monotonic` from when this
    process first saw it so."""

    def __init__(
        self,
        journal: Journal,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.journal = journal
        self.clock = clock
        self.monotonic = monotonic
        # (model, playbook, exclude) -> (the last run's time and the count of runs, when
        # it lay in the wall clock's future; the monotonic time this process first saw it)
        self._ahead: dict[tuple[str, str | None, tuple[str, ...]], tuple[float, int, float]] = {}

    def check(
        self, model: Model, *, playbook: str | None = None, exclude: Sequence[str] = ()
    ) -> BudgetDecision:
        """`playbook`: count only its runs (a playbook with a budget of its own); `exclude`:
        leave out the runs of playbooks that have their own."""
        policy, now = model.policy, self.clock()
        since = now - policy.window
        reset = self.journal.budget_reset_time(model.name)
        if reset is not None:
            since = max(since, reset)
        times = self.journal.counted_run_times(
            model.name, since, playbook=playbook, exclude=exclude
        )
        runs = len(times)
        window = human_duration(policy.window)
        of = f"{playbook} " if playbook is not None else ""
        if runs >= policy.restart_budget:
            return BudgetDecision(
                False,
                True,
                0.0,
                runs,
                f"restart budget spent: {runs} {of}run(s) of {model.name} in the last {window}"
                f" (budget {policy.restart_budget})",
            )
        if runs:
            gap = policy.backoff * 2 ** (runs - 1)
            wait = gap - self._since((model.name, playbook, tuple(exclude)), times, now)
            if wait > 0:
                return BudgetDecision(
                    False,
                    False,
                    wait,
                    runs,
                    f"backoff: {runs} run(s) in the last {window}; next run allowed in"
                    f" {wait:.0f}s (backoff {human_duration(gap)})",
                )
        used = f"{runs} of {policy.restart_budget} runs used"
        return BudgetDecision(True, False, 0.0, runs, used)

    def _since(
        self, key: tuple[str, str | None, tuple[str, ...]], times: Sequence[float], now: float
    ) -> float:
        """Seconds since the last counted run: by the wall clock, or, when a run lies in its
        future, by the monotonic clock since this process first saw these runs so (a run
        counted since starts it again): never more than a backoff."""
        last = times[-1]
        if now >= last:
            self._ahead.pop(key, None)
            return now - last
        seen = self._ahead.get(key)
        if seen is None or seen[:2] != (last, len(times)):
            seen = (last, len(times), self.monotonic())
            self._ahead[key] = seen
        return self.monotonic() - seen[2]


class Escalator:
    """Opens a model's circuit and tells on-call: journal, metric, optional POST.
    The POST runs in the background with a short timeout and never blocks a run."""

    def __init__(
        self,
        journal: Journal,
        escalations: Counter,
        *,
        notify_url: str | None = None,
        hostname: str = "",
        clock: Callable[[], float] = time.time,
        notify_timeout: float = NOTIFY_TIMEOUT,
    ):
        self.journal = journal
        self.escalations = escalations
        self.notify_url = notify_url
        self.hostname = hostname
        self.clock = clock
        self.notify_timeout = notify_timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def escalate(
        self,
        model: str,
        reason: EscalationReason,
        detail: str,
        next_action: str,
        *,
        run_id: int | None = None,
        open_circuit: bool = True,
    ) -> bool:
        """Open the circuit and tell on-call; True if it opened now (False: it already was
        open, or `open_circuit` is false: a playbook with its own budget only tells)."""
        if reason not in set(EscalationReason):  # a closed set: the metric's `reason` label
            known = ", ".join(EscalationReason)
            raise ValueError(f"escalation reason must be one of {known}, not {reason!r}")
        reason = EscalationReason(reason)
        now = self.clock()
        opened = open_circuit and self.journal.open_circuit(
            model,
            reason=f"{reason}: {detail}",
            next_action=next_action,
            by_whom=f"remediator@{self.hostname}",
            now=now,
        )
        self.journal.add_event(
            "escalation",
            now=now,
            model=model,
            run_id=run_id,
            detail=f"{reason}: {detail}. Next: {next_action}",
        )
        if open_circuit:
            self.escalations.labels(model=model, reason=reason).inc()
        log.error(
            "escalation: %s",
            detail,
            extra={"model": model, "reason": reason, "next_action": next_action, "run_id": run_id},
        )
        if self.notify_url:
            payload = {
                "kind": "mlx-medic-escalation",
                "model": model,
                "reason": reason,
                "detail": detail,
                "next_action": next_action,
                "run_id": run_id,
                "time": now,
                "host": self.hostname,
            }
            task = asyncio.get_running_loop().create_task(self._notify(payload))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return opened

    async def _notify(self, payload: dict[str, Any]) -> None:
        import aiohttp

        assert self.notify_url is not None
        model, run_id = payload["model"], payload["run_id"]
        try:
            timeout = aiohttp.ClientTimeout(total=self.notify_timeout)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self.notify_url, json=payload) as response,
            ):
                if response.status >= 300:
                    raise RuntimeError(f"HTTP {response.status}")
        except Exception as exc:  # journaled, never raised: a notifier must not stop a run
            detail = f"POST {self.notify_url} failed: {type(exc).__name__}: {exc}"
            log.warning(detail, extra={"model": model})
            self.journal.add_event(
                "notify_failed", now=self.clock(), model=model, run_id=run_id, detail=detail
            )
            return
        self.journal.add_event(
            "notified",
            now=self.clock(),
            model=model,
            run_id=run_id,
            detail=f"POST {self.notify_url}: escalation delivered",
        )

    async def drain(self, timeout: float = NOTIFY_TIMEOUT + 1) -> None:
        """Wait for notifications in flight (at shutdown and in tests)."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(set(self._tasks), timeout=timeout)
