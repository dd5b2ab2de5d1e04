"""The remediator SIGKILLed right after it stopped a model's service: on its restart the
service runs again, after a sweep, and the journal and the head's record say why.

supervisord runs inside the testbed head's namespaces; its program stands in for the
model's server (it answers the health probe on the model's port). The real remediator
process stops it through `mlx-medic node service` over SSH, is killed, and is started
again."""

from __future__ import annotations

import signal
import socket

import pytest

from mlx_medic.state.service_stop import read_service_stop
from tests.remediator.conftest import (
    Stack,
    events_of,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    wait_until,
)
from tests.remediator.stand_in import stand_in_service

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

HOST = socket.gethostname()  # the remediator runs on this machine, in its UTS namespace


@pytest.mark.least_privilege
def test_a_remediator_killed_after_its_stop_starts_the_service_again_after_a_sweep(
    stack: Stack,
) -> None:
    head = stack.cluster.head
    with stand_in_service(stack) as service:
        program_state, label = service.state, service.label
        routing = {"playbooks": {"LLMModelDown": "recover", "StopHold": "stop-then-hold"}}
        config = stack.config(routing=routing)
        first = stack.start(config=config)
        post_alerts(
            first,
            make_payload(make_alert("m1", alertname="StopHold", fingerprint="5709a0d1c2b3e4f5")),
        )
        stopped = wait_until(
            lambda: [
                s
                for r in runs_of(stack, "m1")
                for s in r["steps"]
                if s["name"] == "stop-service" and s["outcome"] == "ok"
            ],
            timeout=60,
            what=f"the stop step to end ok: {runs_of(stack, 'm1')}",
        )
        assert stopped and program_state() == "STOPPED"
        (killed_run,) = runs_of(stack, "m1")
        record = read_service_stop(head.state_dir, "m1")
        stopped_by = f"remediator run {killed_run['id']} (pid {first.proc.pid} on {HOST})"
        assert record is not None and record.run == stopped_by  # the run and its replica
        first.stop(signal.SIGKILL)  # right after the stop: no chance to clean up

        second = stack.start(config=config)
        done = wait_until(
            lambda: [
                r
                for r in runs_of(stack, "m1")
                if r["playbook"] == "finish-stop" and r["outcome"] not in ("queued", "running")
            ],
            timeout=120,
            what="the finish-stop run to end",
        )[0]
        assert done["outcome"] == "succeeded", (done["detail"], done["steps"])
        assert done["trigger"] == "start-up"
        assert [s["name"] for s in done["steps"]] == ["sweep", "start-service", "verify"]
        assert program_state() == "RUNNING"
        assert read_service_stop(head.state_dir, "m1") is None  # the start cleared it
        (left,) = events_of(stack, kind="service_left_stopped")
        assert left["detail"].startswith(f"{label} on ai001 was left stopped by {stopped_by}")
        interrupted = next(r for r in runs_of(stack, "m1") if r["id"] == killed_run["id"])
        assert interrupted["outcome"] == "interrupted"
        second.stop()
