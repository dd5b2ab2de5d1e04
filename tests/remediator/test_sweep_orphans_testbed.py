"""`sweep-orphans` for real: the remediator's engine, over real SSH to testbed nodes, runs
the real node helpers on the seed's orphans (run 1's mlx.launch SIGKILLed while its ranks
ran on two nodes, the peer's rank left under an sshd session) while run 2 is current."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.model import Model
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.state.runs import record_current_run
from mlx_medic.transport import SshTransport
from testbed import Cluster, processes
from testbed.launch import rank_pids
from tests.exporter.test_seed_orphan import prepare, wait_ready
from tests.node.test_sweep_clean_testbed import wait_until
from tests.remediator.engine_fakes import alert

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

MEDIC = str(Path(sys.executable).parent / "mlx-medic")


async def test_sweep_orphans_over_ssh_ends_the_seeds_orphans_on_the_reporting_node_then_the_others(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model)
    data = yaml.safe_load(scenario.inventory.read_text())
    data["models"]["tiny"]["policy"] = {"kill_grace": "5s", "backoff": 0}
    for node in data["nodes"].values():  # sshd's PATH is minimal; helpers read this inventory
        node.update(medic_command=MEDIC, medic_config=str(scenario.inventory))
    scenario.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    head, peer = cluster.node("ai001"), cluster.node("ai002")
    launches = []
    try:
        for attempt, run_id in enumerate((f"run1-{scenario.token}", f"run2-{scenario.token}")):
            for node in (head, peer):
                record_current_run(node.state_dir, "tiny", run_id)
            launches.append(
                scenario.launch(
                    attempt, "--env", f"MLX_MEDIC_RUN_ID={run_id}", "--env", "MLX_MEDIC_MODEL=tiny"
                )
            )
            wait_ready(launches[-1], 2)
            if attempt == 0:
                old = {n.name: rank_pids(n, str(scenario.script)) for n in (head, peer)}
                launches[0].kill()  # the crash: SIGKILL, no teardown
        current = {
            n.name: set(rank_pids(n, str(scenario.script))) - set(old[n.name]) for n in (head, peer)
        }
        (old_peer_rank,) = old["ai002"]
        assert processes.cmdline(processes.ppid(old_peer_rank))[0].startswith("sshd:")

        inventory = load_inventory(scenario.inventory)
        transport = SshTransport(inventory)
        ssh_transports.append(transport)
        config = RemediatorConfig.model_validate(
            {
                "journal": str(tmp_path / "journal.sqlite"),
                "routing": {"playbooks": {"MLXOrphanProcesses": "sweep-orphans"}},
                "orphans_clean_window": "1s",  # no Prometheus here: its checks, short
            }
        )

        async def model_answers(model: Model) -> HealthVerdict:  # the verify's probe
            return HealthVerdict.up("run 2 is current")  # its ranks serve no HTTP here

        engine = Engine(
            config,
            inventory,
            Journal(config.journal),
            transport,
            registry=CollectorRegistry(),
            health_check=model_answers,
        )
        engines.append(engine)
        await engine.start()
        # The peer reports first: its orphan goes, then the other nodes' (the head's).
        assert (
            await engine.submit(
                alert(
                    uuid.uuid4().hex[:16],
                    "tiny",
                    alertname="MLXOrphanProcesses",
                    labels={"node": "ai002"},
                )
            )
            == Disposition.STARTED
        )
        await engine.wait_idle(240)
        (run,) = engine.journal.list_runs()
        assert run.outcome == "succeeded", (run.detail, [s.output for s in run.steps])
        assert [(s.name, s.node) for s in run.steps] == [
            ("sweep-orphans", "ai002"),
            ("sweep-orphans", "ai001"),
            ("confirm-clean", "ai001, ai002"),
            ("verify", "ai001"),
        ]
        wait_until(lambda: not processes.is_alive(old_peer_rank), "the peer's old rank to go")
        for pid in old["ai001"]:
            wait_until(lambda: not processes.is_alive(pid), "the head's old rank to go")  # noqa: B023
        # The head's own alert, arriving later, finds nothing left to do.
        assert (
            await engine.submit(
                alert(
                    uuid.uuid4().hex[:16],
                    "tiny",
                    alertname="MLXOrphanProcesses",
                    labels={"node": "ai001"},
                )
            )
            == Disposition.STARTED
        )
        await engine.wait_idle(240)
        second = engine.journal.list_runs()[0]
        assert second.outcome == "skipped", second.detail
        # The current run was never touched, and nothing stopped or started the service.
        assert all(processes.is_alive(pid) for pids in current.values() for pid in pids)
        assert launches[1].alive()
        steps = {s.name for r in engine.journal.list_runs() for s in r.steps}
        assert steps == {"sweep-orphans", "confirm-clean", "verify"}
    finally:
        for launch in launches:
            launch.close()
