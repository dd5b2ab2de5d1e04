"""The remediator killed with SIGKILL in the middle of a run, then started again: the
journal shows the interrupted step, the model lock is released, and the same firing
acts again when Alertmanager sends it again."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta

from tests.remediator.conftest import (
    Stack,
    events_of,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    wait_until,
)


def hold_step(stack: Stack, outcome: str) -> list[dict]:
    return [
        s
        for r in runs_of(stack, "m1")
        for s in r["steps"]
        if s["name"] == "hold" and s["outcome"] == outcome
    ]


def test_a_run_killed_mid_step_is_marked_interrupted_and_its_lock_released_at_restart(
    stack: Stack,
) -> None:
    started = datetime.now(UTC) - timedelta(minutes=1)
    first = stack.start()
    alert = make_alert("m1", alertname="SlowDown", fingerprint="crash", starts_at=started)
    assert post_alerts(first, make_payload(alert))[1]["alerts"][0]["disposition"] == "started"
    wait_until(lambda: hold_step(stack, "running"), what="the slow step to start")
    lock = json.loads(stack.lock_file("m1").read_text())
    assert lock["pid"] == first.proc.pid

    first.stop(signal.SIGKILL)
    # The crash leaves what was in flight visible: the step written before it started.
    assert hold_step(stack, "running")
    assert stack.lock_file("m1").exists()

    second = stack.start()
    interrupted = wait_until(
        lambda: hold_step(stack, "interrupted"), what="the step marked interrupted"
    )
    assert len(interrupted) == 1
    [run] = runs_of(stack, "m1")
    assert run["outcome"] == "interrupted"
    assert not stack.lock_file("m1").exists()
    released = events_of(stack, kind="lock_released", model="m1")
    assert released and str(first.proc.pid) in released[0]["detail"]

    # The interrupted run fixed nothing: a redelivery of the same firing acts again, and
    # while that run is in flight a further redelivery is a duplicate.
    assert post_alerts(second, make_payload(alert))[1]["alerts"][0]["disposition"] == "started"
    wait_until(lambda: hold_step(stack, "running"), what="the next run to act")
    assert json.loads(stack.lock_file("m1").read_text())["pid"] == second.proc.pid
    assert post_alerts(second, make_payload(alert))[1]["alerts"][0]["disposition"] == "duplicate"

    # A graceful stop interrupts the run too, and leaves no lock behind.
    assert second.stop(signal.SIGTERM) == 0
    assert [r["outcome"] for r in runs_of(stack, "m1")] == ["interrupted", "interrupted"]
    assert not stack.lock_file("m1").exists()
