"""The remediator SIGKILLed right after it stopped a model's service: on its restart the
service runs again, after a sweep, and the journal and the head's record say why.

supervisord runs inside the testbed head's namespaces; its program stands in for the
model's server (it answers the health probe on the model's port). The real remediator
process stops it through `mlx-medic node service` over SSH, is killed, and is started
again."""

from __future__ import annotations

import signal
import sys
import uuid

import pytest
import yaml

from mlx_medic.state.service_stop import read_service_stop
from testbed import free_port
from tests.node.test_service_helper import SUPERVISORD_CONTROL
from tests.node.test_sweep_clean_testbed import HEALTHY_SERVER
from tests.remediator.conftest import (
    Stack,
    events_of,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    wait_until,
)
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

# supervisord as the service helper's test runs it, with a program that answers the probe.
SUPERVISORD_CONF = (
    SUPERVISORD_CONTROL
    + """\
[program:m1-{token}]
command={python} {server} --port {port}
startsecs=0
"""
)


@pytest.mark.least_privilege
def test_a_remediator_killed_after_its_stop_starts_the_service_again_after_a_sweep(
    stack: Stack,
) -> None:
    require_tool("supervisord")
    cluster, head = stack.cluster, stack.cluster.head
    token, port = uuid.uuid4().hex[:8], free_port()
    server = cluster.workdir / f"server-{token}.py"
    server.write_text(HEALTHY_SERVER)
    conf = cluster.workdir / f"supervisord-{token}.conf"
    conf.write_text(
        SUPERVISORD_CONF.format(token=token, python=sys.executable, server=server, port=port)
    )
    data = yaml.safe_load(stack.inventory.read_text())
    # The helpers on the head read the inventory there (a node's /tmp is its own).
    on_node = cluster.workdir / f"inventory-{token}.yaml"
    data["nodes"]["ai001"]["medic_config"] = str(on_node)
    data["models"]["m1"].update(
        port=port,
        service={"manager": "supervisord", "label": f"m1-{token}", "config": str(conf)},
        policy={"restart_budget": 5, "backoff": 0, "start_timeout": "60s"},
    )
    for path in (stack.inventory, on_node):
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    def program_state() -> str:
        done = head.run(f"supervisorctl -c {conf} status m1-{token}", check=False)
        return done.stdout.split()[1] if len(done.stdout.split()) > 1 else done.stdout

    daemon = head.spawn(["supervisord", "-n", "-c", str(conf)])
    try:
        wait_until(lambda: program_state() == "RUNNING", what="supervisord's program")
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
        assert record is not None and record.run == f"remediator run {killed_run['id']}"
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
        assert left["detail"].startswith(
            f"m1-{token} on ai001 was left stopped by remediator run {killed_run['id']}"
        )
        interrupted = next(r for r in runs_of(stack, "m1") if r["id"] == killed_run["id"])
        assert interrupted["outcome"] == "interrupted"
        second.stop()
    finally:
        daemon.kill()  # the host-side nsenter; clean_cluster ends what ran inside the node
        daemon.wait(timeout=10)
