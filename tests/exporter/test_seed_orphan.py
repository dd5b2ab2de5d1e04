"""The seed's orphan, for real: mlx.launch (ring) starts ranks on ai001 and ai002,
the launcher is SIGKILLed, the same model is started again. Each node's
exporter, run inside that node, reports what that node alone can tell."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlx_medic.runs import record_current_run
from testbed import Cluster, free_port, processes
from testbed.freezer import frozen
from testbed.launch import rank_pids, start_launch

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# A rank that really joins the ring (mx.distributed.init), then holds on like a server.
RANK_SCRIPT = """\
import sys, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.ones(1))
mx.eval(total)
print(f"rank {group.rank()} of {group.size()} ready sum={total.item():.0f}", flush=True)
time.sleep(3600)
"""


def scrape(cluster: Cluster, node: str, inventory: Path) -> dict[tuple, float]:
    """One `mlx-medic exporter --once` inside the node's namespaces, by name and labels
    (without `node`, checked to be this node on every series)."""
    popen = cluster.node(node).spawn(
        [cluster.python, "-m", "mlx_medic.cli", "exporter", "--once",
         "--config.file", str(inventory), "--node", node,
         "--no-collector.service"],  # the live probe is another test's business
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert popen.returncode == 0, err.decode()
    samples: dict[tuple, float] = {}
    for family in text_string_to_metric_families(out.decode()):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("node") == node  # every series names the node it is from
            samples[(sample.name, *sorted(labels.items()))] = sample.value
    return samples


def total(samples: dict[tuple, float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for key, v in samples.items() if key[0] == name and wanted <= set(key[1:]))


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while processes.is_alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} still alive")
        time.sleep(0.05)


def wait_ready(run, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while run.output().count("ready sum=2") < count:
        if run.popen.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{count} ranks not ready:\n{run.output()}")
        time.sleep(0.2)


@dataclass
class Scenario:
    """One model on ai001 (head) and ai002, with a unique token, port and ring ports."""

    cluster: Cluster
    token: str
    script: Path
    hostfile: Path
    inventory: Path
    rank_argv: list[str]
    ring_port: int

    @property
    def port(self) -> int:
        return int(self.rank_argv[self.rank_argv.index("--port") + 1])

    def launch(self, attempt: int, *extra: str):
        ports = ["--starting-port", str(self.ring_port + 5 * attempt)]
        return start_launch(self.cluster, self.hostfile, self.rank_argv,
                            launch_args=[*ports, *extra])


def prepare(cluster: Cluster, tiny_model: Path, *, real_server: bool = False) -> Scenario:
    token = uuid.uuid4().hex[:8]
    script = cluster.workdir / f"rank-{token}.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    hostfile = cluster.hostfile(cluster.workdir / f"ring-{token}.json", ["ai001", "ai002"])
    inventory = cluster.workdir / f"inventory-{token}.yaml"
    inventory.write_text(cluster.inventory_yaml([{
        "name": "tiny",
        "model": str(tiny_model),
        "nodes": ["ai001", "ai002"],
        "port": port,
        "service": {"manager": "supervisord", "label": f"tiny-{token}"},
        "backends": {"ring": {"hostfile": str(hostfile)}},
    }]))
    rank_argv = [cluster.python, str(script), "--model", str(tiny_model), "--port", str(port)]
    if real_server:
        rank_argv = [cluster.python, "-m", "mlx_lm", "server", "--model", str(tiny_model),
                     "--host", "127.0.0.1", "--port", str(port), "--pipeline"]
    return Scenario(cluster, token, script, hostfile, inventory, rank_argv,
                    random.randrange(42000, 52000, 20))


def test_a_killed_launcher_leaves_a_peer_orphan_under_sshd_that_the_peer_reports(
    clean_cluster: Cluster, tiny_model: Path
):
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model)
    script, inventory, token = scenario.script, scenario.inventory, scenario.token

    first = scenario.launch(0)
    second = None
    try:
        wait_ready(first, 2)
        peer = cluster.node("ai002")
        (old_peer_rank,) = rank_pids(peer, script.name)

        first.kill()  # the crash: SIGKILL, no teardown
        second = scenario.launch(1)
        wait_ready(second, 2)

        # On the peer: the old rank lives on, its parent an sshd session, not pid 1.
        peer_ranks = rank_pids(peer, script.name)
        assert len(peer_ranks) == 2 and old_peer_rank in peer_ranks
        parent = processes.ppid(old_peer_rank)
        assert processes.cmdline(parent)[0].startswith("sshd:")
        assert peer.ns_pid_of(parent) != 1
        # ...so the seed's `ppid == 1` sweep finds nothing there.
        assert [p for p in peer_ranks if peer.ns_pid_of(processes.ppid(p)) == 1] == []

        on_peer = scrape(cluster, "ai002", inventory)
        assert total(on_peer, "mlx_processes", model="tiny", role="rank") == 2
        assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank") == 1
        assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank",
                     rule="excess_ranks") == 1
        assert on_peer[("mlx_orphan_oldest_age_seconds", ("model", "tiny"))] > 0

        # On the launching node: the dead launch's local rank and ssh client, and the
        # peer that client pointed at.
        on_head = scrape(cluster, "ai001", inventory)
        assert total(on_head, "mlx_processes", model="tiny", role="launcher") == 1
        assert total(on_head, "mlx_processes", model="tiny", role="rank") == 2
        assert total(on_head, "mlx_processes", model="tiny", role="ssh_client") == 2
        for role in ("rank", "ssh_client"):
            assert total(on_head, "mlx_orphan_processes", model="tiny", role=role,
                         rule="launcher_gone") == 1
            assert total(on_head, "mlx_orphan_processes", model="tiny", role=role) == 1
        assert on_head[("mlx_suspected_remote_orphans", ("model", "tiny"),
                        ("peer", "ai002"))] == 1

        # The seed's end state: the orphan stuck in uninterruptible wait, its sshd stuck
        # with it, and the client gone. Freeze both (cgroup v1 freezer: state D, SIGKILL
        # pends), then SIGKILL the dead launch's ssh client on the head.
        head = cluster.node("ai001")
        (old_client,) = [p for p in head.host_pids()
                         if processes.cmdline(p)[:1] == ["/usr/bin/ssh"]
                         and head.ns_pid_of(processes.ppid(p)) == 1]
        with frozen([old_peer_rank, parent], token):
            os.kill(old_client, signal.SIGKILL)
            wait_gone(old_client)
            os.kill(old_peer_rank, signal.SIGKILL)  # pends: the seed's unkillable Us+ rank
            on_peer = scrape(cluster, "ai002", inventory)
            assert processes.is_alive(old_peer_rank)
            assert processes.ppid(old_peer_rank) == parent  # still sshd, still not 1
            assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank") == 1
            assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank",
                         state="uninterruptible", rule="ssh_client_lost") == 1
            assert total(on_peer, "mlx_processes", model="tiny", role="rank",
                         state="uninterruptible") == 1
    finally:
        first.close()
        if second is not None:
            second.close()


def test_with_run_ids_every_leftover_of_the_dead_launch_is_a_stale_run(
    clean_cluster: Cluster, tiny_model: Path
):
    """The serve wrapper's convention: ranks carry MLX_MEDIC_RUN_ID, each node
    records the model's current run; the old run's ranks are stale wherever they are."""
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model)
    nodes = [cluster.node("ai001"), cluster.node("ai002")]
    runs = []
    try:
        for attempt, run_id in enumerate(("run-1", "run-2")):
            for node in nodes:
                record_current_run(node.state_dir, "tiny", run_id)
            run = scenario.launch(attempt, "--env", f"MLX_MEDIC_RUN_ID={run_id}",
                                  "--env", "MLX_MEDIC_MODEL=tiny")
            runs.append(run)
            wait_ready(run, 2)
            if attempt == 0:
                run.kill()

        on_peer = scrape(cluster, "ai002", scenario.inventory)
        assert total(on_peer, "mlx_orphan_processes", model="tiny") == 1
        assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank",
                     rule="stale_run_id") == 1

        on_head = scrape(cluster, "ai001", scenario.inventory)
        assert total(on_head, "mlx_orphan_processes", model="tiny") == 2
        for role in ("rank", "ssh_client"):
            assert total(on_head, "mlx_orphan_processes", model="tiny", role=role,
                         rule="stale_run_id") == 1
        assert on_head[("mlx_suspected_remote_orphans", ("model", "tiny"),
                        ("peer", "ai002"))] == 1
    finally:
        for run in runs:
            run.close()


def wait_serving(port: int, run, timeout: float = 240.0) -> None:
    """Rank 0 of a real mlx_lm.server answers /health once every rank has loaded."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if run.popen.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"mlx_lm.server not serving on {port}:\n{run.output()[-3000:]}")
        time.sleep(0.5)


def test_real_mlx_lm_server_ranks_the_seeds_stuck_peer_orphan_beside_the_restarted_model(
    clean_cluster: Cluster, tiny_model: Path
):
    """Real `mlx_lm server --pipeline` over ring. The crash as launchd lives it: the
    launcher dies and launchd takes the head's process group (local rank, ssh client)
    with it; on the peer the rank and its sshd are stuck (frozen: state D) and stay."""
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model, real_server=True)
    head, peer = cluster.node("ai001"), cluster.node("ai002")
    runs = [scenario.launch(0)]
    try:
        wait_serving(scenario.port, runs[0])
        (old_peer_rank,) = rank_pids(peer, "mlx_lm")
        session = processes.ppid(old_peer_rank)
        with frozen([old_peer_rank, session], scenario.token):
            runs[0].kill()
            leftovers = [p for p in head.host_pids()
                         if processes.ppid(p) == head.init_pid  # adopted by the node's pid 1
                         and processes.cmdline(p)[:1] in (["/usr/bin/ssh"], [cluster.python])]
            assert len(leftovers) == 2, [processes.cmdline(p) for p in leftovers]
            for pid in leftovers:  # what launchd does to the dead job's process group
                os.kill(pid, signal.SIGKILL)
            for pid in leftovers:
                wait_gone(pid)

            runs.append(scenario.launch(1))
            wait_serving(scenario.port, runs[1])

            peer_ranks = rank_pids(peer, "mlx_lm")
            assert len(peer_ranks) == 2
            assert processes.ppid(old_peer_rank) == session  # a stuck sshd, not pid 1
            assert [p for p in peer_ranks if peer.ns_pid_of(processes.ppid(p)) == 1] == []

            on_peer = scrape(cluster, "ai002", scenario.inventory)
            assert total(on_peer, "mlx_processes", model="tiny", role="rank") == 2
            assert total(on_peer, "mlx_processes", model="tiny", role="rank",
                         state="uninterruptible") == 1
            assert total(on_peer, "mlx_orphan_processes", model="tiny") == 1
            assert total(on_peer, "mlx_orphan_processes", model="tiny", role="rank",
                         state="uninterruptible", rule="ssh_client_lost") == 1

            on_head = scrape(cluster, "ai001", scenario.inventory)
            assert total(on_head, "mlx_processes", model="tiny", role="rank") == 1
            assert total(on_head, "mlx_orphan_processes", model="tiny") == 0
            assert on_head[("mlx_suspected_remote_orphans", ("model", "tiny"),
                            ("peer", "ai002"))] == 0
    finally:
        for run in runs:
            run.close()
