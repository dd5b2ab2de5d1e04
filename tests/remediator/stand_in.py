"""A stand-in for a model's server on the testbed head: supervisord inside the head's
namespaces runs a program that answers the health probe on the model's port, and the
stack's model m1 is pointed at it, so a real remediator stops, starts and verifies it
through `mlx-medic node service` over SSH in seconds (no model to load)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed import free_port
from tests.node.test_service_helper import SUPERVISORD_CONTROL
from tests.node.test_sweep_clean_testbed import HEALTHY_SERVER
from tests.remediator.conftest import Stack, wait_until
from tests.tools import require_tool

SUPERVISORD_CONF = (
    SUPERVISORD_CONTROL
    + """\
[program:m1-{token}]
command={python} {server} --port {port}
startsecs=0
"""
)


@dataclass
class StandIn:
    """m1's service: supervisord's program `label` in the head, answering on `port`."""

    stack: Stack
    label: str
    conf: Path
    port: int

    def supervisorctl(self, *args: str) -> str:
        done = self.stack.cluster.head.run(
            f"supervisorctl -c {self.conf} {' '.join(args)} {self.label}", check=False
        )
        return str(done.stdout)

    def state(self) -> str:
        """supervisord's word for the program: RUNNING, STOPPED, ..."""
        words = self.supervisorctl("status").split()
        return words[1] if len(words) > 1 else " ".join(words)


@contextmanager
def stand_in_service(stack: Stack) -> Iterator[StandIn]:
    """m1 served by the stand-in (RUNNING when this yields), supervisord ended after."""
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
    stand_in = StandIn(stack, f"m1-{token}", conf, port)
    daemon = head.spawn(["supervisord", "-n", "-c", str(conf)])
    try:
        wait_until(lambda: stand_in.state() == "RUNNING", what="supervisord's program")
        yield stand_in
    finally:
        daemon.kill()  # the host-side nsenter; clean_cluster ends what ran inside the node
        daemon.wait(timeout=10)
