"""The guarded reboot (`reboot-node`, issue 29 part 3) on real parts: the serve wrapper under
supervisord serves the tiny model on ai001 (head) and ai002 over the testbed's simulated
JACCL; a frozen survivor of an earlier crashed run (state D: it survives SIGKILL) holds a
protection domain on ai002, so with `policy.pd_reserve: 1` the ledger refuses JACCL there
and the model serves on ring. The remediator's engine, over real SSH and the real node
helpers, gets MLXUnkillableSurvivors for ai002: off by default it declines, naming the
`off` guard; with `reboot.allowed` it pauses, stops, sweeps, runs the node's reboot command
through `mlx-medic node reboot`, sees the new boot id, starts the model again and verifies
it: it serves on JACCL and answers. The other guards' refusals are shown by the fast tests
with the real playbook and scripted helpers (tests/remediator/test_reboot_node.py).

The reboot seam: nothing here reboots a machine. The node's `reboot.command` is
`/usr/bin/touch REQUESTS/ai002`; the helper runs it inside ai002 (as root there, the
testbed's default login, it runs the command itself; the rendered `sudo -n` rule is the
three-user mode's, which this test skips). A thread of this test watches REQUESTS and, for
each request file, calls the testbed's `Cluster.reboot(NODE)` (the node's namespaces end,
frozen groups thawed, and start again with a new boot id) and removes the file.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.playbooks.reboot_node import REBOOT_NODE
from mlx_medic.transport import SshTransport
from testbed import Cluster, processes
from testbed.faults import frozen_survivor
from testbed.jaccl_sim import JacclSim
from tests.remediator.engine_fakes import alert
from tests.serve.scenario import Served, answers, prepare, supervised
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

NODE = "ai002"
ROUTING = {"LLMModelDown": "recover", "MLXUnkillableSurvivors": REBOOT_NODE}


class RebootRequests:
    """The seam (see the module): a request file per node asks this test to reboot it."""

    def __init__(self, cluster: Cluster, directory: Path):
        self.cluster, self.directory = cluster, directory
        directory.mkdir()
        self.done: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def command(self, node: str) -> list[str]:
        return ["/usr/bin/touch", str(self.directory / node)]

    def _watch(self) -> None:
        while not self.stop.wait(0.2):
            for request in sorted(self.directory.iterdir()):
                self.cluster.reboot(request.name)
                request.unlink()
                self.done.append(request.name)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def set_reboot(served: Served, reboot: dict[str, Any]) -> None:
    data = yaml.safe_load(served.inventory.read_text())
    data["nodes"][NODE]["reboot"] = reboot
    served.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


async def engine_for(
    served: Served, tmp_path: Path, ssh: list[SshTransport], engines: list[Engine], name: str
) -> Engine:
    inventory = load_inventory(served.inventory)
    transport = SshTransport(inventory)
    ssh.append(transport)
    config = RemediatorConfig.model_validate(
        {
            "inventory": str(served.inventory),
            "journal": str(tmp_path / f"{name}.sqlite"),
            "routing": {"playbooks": ROUTING},
        }
    )
    engine = Engine(
        config, inventory, Journal(config.journal), transport, registry=CollectorRegistry()
    )
    engines.append(engine)
    await engine.start()
    return engine


def survivors_alert(fingerprint: str) -> Any:
    return alert(
        fingerprint,
        model=None,
        alertname="MLXUnkillableSurvivors",
        labels={"node": NODE, "models": "tiny"},
    )


async def test_the_remediator_reboots_the_node_of_the_survivors_and_the_model_returns_to_jaccl(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    releasing_sim: JacclSim,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    require_tool("supervisord")
    cluster = clean_cluster
    if cluster.node_user is not None:
        pytest.skip("the reboot seam runs the command as root (the testbed's default login)")
    policy = {"kill_grace": "3s", "stop_timeout": "40s", "start_timeout": "5m", "pd_reserve": 1}
    served = prepare(
        cluster,
        tiny_model,
        serve={**releasing_sim.serve_settings(), "smoke_timeout": "90s"},
        extra_model={"policy": policy},
        checkout_on_nodes=True,
    )
    # The seed's survivor: an earlier JACCL run crashed, its rank on ai002 frozen (state D).
    stuck = frozen_survivor(
        cluster,
        releasing_sim,
        model=tiny_model,
        port=served.port,
        hostfile=served.jaccl_hostfile,
        starting_port=random.randrange(53000, 60000, 20),
        log=tmp_path / "earlier.log",
    )
    requests = RebootRequests(cluster, cluster.workdir / f"reboot-{served.token}")
    try:
        with supervised(served):
            record = served.wait_serving()
            assert record.backend == "ring", record  # the ledger refuses JACCL on ai002

            # Off by default: declined before any run, the guard named.
            off = await engine_for(served, tmp_path, ssh_transports, engines, "off")
            assert await off.submit(survivors_alert("u0")) is Disposition.UNROUTED
            (declined,) = [e.detail for e in off.journal.list_events(kind="unrouted")]
            assert (
                declined == f"reboot refused by the off guard: nodes.{NODE}.reboot.allowed is false"
            )
            assert off.journal.list_runs() == []

            set_reboot(
                served,
                {
                    "allowed": True,
                    "command": requests.command(NODE),
                    "min_uptime": 0,
                    "boot_timeout": "3m",
                },
            )
            old_boot = cluster.node(NODE).boot_id
            engine = await engine_for(served, tmp_path, ssh_transports, engines, "on")
            started = time.monotonic()
            assert await engine.submit(survivors_alert("u1")) is Disposition.STARTED
            await engine.wait_idle(600)
            (run,) = engine.journal.list_runs()
            steps = [(s.name, s.outcome) for s in run.steps]
            assert run.outcome == "succeeded", (run.detail, steps, served.log.read_text()[-3000:])
            assert requests.done == [NODE]
            assert cluster.node(NODE).boot_id != old_boot
            assert not processes.is_alive(stuck)
            reboot = next(s for s in run.steps if s.name == "reboot-node")
            assert (
                reboot.detail == f"{NODE} rebooted: boot {old_boot} -> {cluster.node(NODE).boot_id}"
            )
            (said,) = [e.detail for e in engine.journal.list_events(kind="reboot")]
            assert said.startswith(f"rebooting {NODE} (boot id {old_boot}) by remediator run")
            assert run.detail.startswith("tiny verified healthy on jaccl"), run.detail
            assert engine.journal.controls() == []  # the run's pause is cleared
            record = served.wait_serving()
            assert record.backend == "jaccl" and answers(served.port)
            print(f"reboot-node run: {time.monotonic() - started:.1f}s, steps {steps}")
    finally:
        requests.close()
