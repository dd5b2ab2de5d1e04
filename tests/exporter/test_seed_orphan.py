"""The seed's orphan, for real: mlx.launch (ring) starts ranks on ai001 and ai002,
the launcher is SIGKILLed, the same model is started again. Each node's
exporter, run inside that node, reports what that node alone can tell, with the
inventory and without one (discovery mode, the README's main job)."""

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

from mlx_medic.state.runs import record_current_run
from testbed import Cluster, free_port, processes
from testbed.freezer import frozen
from testbed.launch import rank_pids, start_launch

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# A rank that really joins the ring (mx.distributed.init), then holds on like a server.
# Saved as `serve.py`, the seed's rank script, found through the model's process pattern.
RANK_SCRIPT = """\
import sys, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.ones(1))
mx.eval(total)
print(f"rank {group.rank()} of {group.size()} ready sum={total.item():.0f}", flush=True)
time.sleep(3600)
"""


def scrape(cluster: Cluster, node: str, inventory: Path | None) -> dict[tuple, float]:
    """One `mlx-medic exporter --once` inside the node's namespaces, by name and labels
    (without `node`, checked to be this node on every series: the node's state dir holds
    its node-id). `inventory=None`: discovery mode, where models are named by their
    `--model` argument."""
    where = (
        ["--inventory", str(inventory), "--node", node]
        if inventory is not None
        else ["--state-dir", str(cluster.node(node).state_mount)]
    )
    popen = cluster.node(node).spawn(
        [
            cluster.python,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--once",
            *where,
            "--no-collector.service",
        ],  # the live probe is another test's business
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

    @property
    def model(self) -> str:
        """The model's name without an inventory: its `--model` argument."""
        return self.rank_argv[self.rank_argv.index("--model") + 1]

    def launch(self, attempt: int, *extra: str, same_placement: bool = False):
        """mlx.launch of the rank command. `same_placement`: the ring ports of attempt 0,
        as a KeepAlive restart of the same command has (every rank's hostfile then holds
        the same content under a new temporary path)."""
        offset = 0 if same_placement else 5 * attempt
        ports = ["--starting-port", str(self.ring_port + offset)]
        return start_launch(
            self.cluster,
            self.hostfile,
            self.rank_argv,
            env=self.cluster.env(HF_HUB_OFFLINE="1"),
            launch_args=[*ports, *extra],
        )


def prepare(cluster: Cluster, tiny_model: Path, *, real_server: bool = False) -> Scenario:
    token = uuid.uuid4().hex[:8]
    script = cluster.workdir / f"seed-{token}" / "serve.py"
    script.parent.mkdir()
    script.write_text(RANK_SCRIPT)
    port = free_port()
    hostfile = cluster.hostfile(cluster.workdir / f"ring-{token}.json", ["ai001", "ai002"])
    inventory = cluster.workdir / f"inventory-{token}.yaml"
    inventory.write_text(
        cluster.inventory_yaml(
            [
                {
                    "name": "tiny",
                    "model": str(tiny_model),
                    "nodes": ["ai001", "ai002"],
                    "port": port,
                    "service": {"manager": "supervisord", "label": f"tiny-{token}"},
                    "backends": {"ring": {"hostfile": str(hostfile)}},
                    "process_patterns": {"rank": [rf"serve\.py --model \S+ --port {port}"]},
                }
            ]
        )
    )
    rank_argv = [cluster.python, str(script), "--model", str(tiny_model), "--port", str(port)]
    if real_server:
        rank_argv = [
            cluster.python,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            str(tiny_model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--pipeline",
        ]
    return Scenario(
        cluster, token, script, hostfile, inventory, rank_argv, random.randrange(42000, 52000, 20)
    )


def test_the_peer_finds_the_seeds_orphan_under_sshd_with_or_without_an_inventory(
    clean_cluster: Cluster, tiny_model: Path
):
    """The seed: the rank script is `serve.py`; the service restarts the same command, so
    the new launch hands its ranks the same placement under new temporary hostfiles."""
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model)
    script, inventory, token = scenario.script, scenario.inventory, scenario.token
    modes = {"tiny": inventory, scenario.model: None}  # model label -> --inventory

    first = scenario.launch(0)
    second = None
    try:
        wait_ready(first, 2)
        peer = cluster.node("ai002")
        (old_peer_rank,) = rank_pids(peer, str(script))

        first.kill()  # the crash: SIGKILL, no teardown
        second = scenario.launch(1, same_placement=True)
        wait_ready(second, 2)

        # On the peer: the old rank lives on, its parent an sshd session, not pid 1.
        peer_ranks = rank_pids(peer, str(script))
        assert len(peer_ranks) == 2 and old_peer_rank in peer_ranks
        parent = processes.ppid(old_peer_rank)
        assert processes.cmdline(parent)[0].startswith("sshd:")
        assert peer.ns_pid_of(parent) != 1
        # ...so the seed's `ppid == 1` sweep finds nothing there.
        assert [p for p in peer_ranks if peer.ns_pid_of(processes.ppid(p)) == 1] == []
        # Each rank got its own temporary hostfile, with the same content.
        hostfiles = [environ(pid)["MLX_HOSTFILE"] for pid in peer_ranks]
        assert hostfiles[0] != hostfiles[1]
        assert len({peer.host_path(h).read_text() for h in hostfiles}) == 1

        # The dead launch's ssh client still lives on the head, so both peer ranks have a
        # session with a client and neither serves HTTP: nothing on the peer tells which
        # launch is current. Both are suspects (never swept), not orphans; with and
        # without an inventory.
        peer_has_two_rank_1_suspects(cluster, modes)

        # On the launching node: the dead launch's local rank and ssh client, and the
        # peer that client pointed at.
        for model, config in modes.items():
            on_head = scrape(cluster, "ai001", config)
            assert total(on_head, "mlx_processes", model=model, role="launcher") == 1
            assert total(on_head, "mlx_processes", model=model, role="rank") == 2
            assert total(on_head, "mlx_processes", model=model, role="ssh_client") == 2
            for role in ("rank", "ssh_client"):
                assert (
                    total(
                        on_head,
                        "mlx_orphan_processes_by_rule",
                        model=model,
                        role=role,
                        rule="launcher_gone",
                    )
                    == 1
                )
                assert total(on_head, "mlx_orphan_processes_by_rule", model=model, role=role) == 1
            assert total(on_head, "mlx_suspected_orphan_processes", model=model) == 0
            peer_label = "ai002" if config is not None else peer.address
            assert (
                on_head[("mlx_suspected_remote_orphans", ("model", model), ("peer", peer_label))]
                == 1
            )

        # The seed's end state: the orphan stuck in uninterruptible wait, its sshd stuck
        # with it, and the client gone. Freeze both (cgroup v1 freezer: state D, SIGKILL
        # pends), then SIGKILL the dead launch's ssh client on the head.
        head = cluster.node("ai001")
        (old_client,) = [
            p
            for p in head.host_pids()
            if processes.cmdline(p)[:1] == ["/usr/bin/ssh"]
            and head.ns_pid_of(processes.ppid(p)) == 1
        ]
        with frozen([old_peer_rank, parent], token):
            os.kill(old_client, signal.SIGKILL)
            wait_gone(old_client)
            os.kill(old_peer_rank, signal.SIGKILL)  # pends: the seed's unkillable Us+ rank
            assert processes.is_alive(old_peer_rank)
            assert processes.ppid(old_peer_rank) == parent  # still sshd, still not 1
            for model, config in modes.items():
                on_peer = scrape(cluster, "ai002", config)
                assert total(on_peer, "mlx_orphan_processes_by_rule", model=model, role="rank") == 1
                assert (
                    total(
                        on_peer,
                        "mlx_orphan_processes_by_rule",
                        model=model,
                        role="rank",
                        state="uninterruptible",
                        rule="ssh_client_lost",
                    )
                    == 1
                )
                assert (
                    total(
                        on_peer, "mlx_processes", model=model, role="rank", state="uninterruptible"
                    )
                    == 1
                )
                assert total(on_peer, "mlx_suspected_orphan_processes", model=model) == 0
                assert on_peer[("mlx_orphan_oldest_age_seconds", ("model", model))] > 0
    finally:
        first.close()
        if second is not None:
            second.close()


def peer_has_two_rank_1_suspects(cluster: Cluster, modes: dict[str, Path | None]) -> None:
    """ai002 holds two rank-1 processes of one placement that nothing there tells apart."""
    for model, config in modes.items():
        on_peer = scrape(cluster, "ai002", config)
        assert total(on_peer, "mlx_processes", model=model, role="rank") == 2
        assert total(on_peer, "mlx_orphan_processes", model=model) == 0
        assert (
            total(
                on_peer,
                "mlx_suspected_orphan_processes",
                model=model,
                role="rank",
                rule="duplicate_rank_undecided",
            )
            == 2
        )


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.decode().partition("=")[::2] for e in raw.split(b"\0") if b"=" in e)


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
            run = scenario.launch(
                attempt, "--env", f"MLX_MEDIC_RUN_ID={run_id}", "--env", "MLX_MEDIC_MODEL=tiny"
            )
            runs.append(run)
            wait_ready(run, 2)
            if attempt == 0:
                run.kill()

        on_peer = scrape(cluster, "ai002", scenario.inventory)
        assert total(on_peer, "mlx_orphan_processes", model="tiny") == 1
        assert (
            total(
                on_peer,
                "mlx_orphan_processes_by_rule",
                model="tiny",
                role="rank",
                rule="stale_run_id",
            )
            == 1
        )

        on_head = scrape(cluster, "ai001", scenario.inventory)
        assert total(on_head, "mlx_orphan_processes", model="tiny") == 2
        for role in ("rank", "ssh_client"):
            assert (
                total(
                    on_head,
                    "mlx_orphan_processes_by_rule",
                    model="tiny",
                    role=role,
                    rule="stale_run_id",
                )
                == 1
            )
        assert on_head[("mlx_suspected_remote_orphans", ("model", "tiny"), ("peer", "ai002"))] == 1
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
            leftovers = [
                p
                for p in head.host_pids()
                if processes.ppid(p) == head.init_pid  # adopted by the node's pid 1
                and processes.cmdline(p)[:1] in (["/usr/bin/ssh"], [cluster.python])
            ]
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
            assert (
                total(on_peer, "mlx_processes", model="tiny", role="rank", state="uninterruptible")
                == 1
            )
            assert total(on_peer, "mlx_orphan_processes", model="tiny") == 1
            assert (
                total(
                    on_peer,
                    "mlx_orphan_processes_by_rule",
                    model="tiny",
                    role="rank",
                    state="uninterruptible",
                    rule="ssh_client_lost",
                )
                == 1
            )

            on_head = scrape(cluster, "ai001", scenario.inventory)
            assert total(on_head, "mlx_processes", model="tiny", role="rank") == 1
            assert total(on_head, "mlx_orphan_processes", model="tiny") == 0
            assert total(on_head, "mlx_suspected_remote_orphans", model="tiny") == 0
    finally:
        for run in runs:
            run.close()


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_a_lingering_failed_launch_attempt_never_marks_the_rank_that_serves(
    clean_cluster: Cluster, tiny_model: Path
):
    """Real `mlx_lm server --pipeline` over ring. While the model serves, the same command
    is launched again (the seed's manual run beside launchd's): the new rank 0 cannot bind
    the port (`Address already in use`) yet hangs on, with its launcher and its peer rank.
    By age the serving ranks would be the orphans; by launcher, nothing would be. Then the
    first launcher is SIGKILLed: its rank 0 still holds the port and is still kept."""
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model, real_server=True)
    head, peer = cluster.node("ai001"), cluster.node("ai002")
    modes = {"tiny": scenario.inventory, scenario.model: None}  # model label -> inventory
    runs = [scenario.launch(0)]
    try:
        wait_serving(scenario.port, runs[0])
        (serving_rank,) = rank_pids(head, "mlx_lm")
        runs.append(scenario.launch(1, same_placement=True))
        runs[1].wait_for_output("Address already in use", timeout=240)
        time.sleep(1)
        assert runs[1].alive()  # the failed attempt lingers beside the serving run
        (failed_rank,) = [p for p in rank_pids(head, "mlx_lm") if p != serving_rank]
        assert len(rank_pids(peer, "mlx_lm")) == 2
        assert serving(scenario.port)

        def only_the_failed_rank_0_is_an_orphan() -> None:
            for model, config in modes.items():
                on_head = scrape(cluster, "ai001", config)
                assert total(on_head, "mlx_processes", model=model, role="rank") == 2
                assert total(on_head, "mlx_orphan_processes", model=model) == 1
                assert (
                    total(
                        on_head,
                        "mlx_orphan_processes_by_rule",
                        model=model,
                        role="rank",
                        rule="duplicate_rank",
                    )
                    == 1
                )
                assert total(on_head, "mlx_suspected_orphan_processes", model=model) == 0
                assert total(on_head, "mlx_suspected_remote_orphans", model=model) == 0

            # The peer cannot tell its two rank-1 processes apart (both sessions hold a
            # client, rank 1 serves no port): suspects, which nothing sweeps.
            peer_has_two_rank_1_suspects(cluster, modes)

        only_the_failed_rank_0_is_an_orphan()
        assert serving(scenario.port)

        # The first launcher dies (no teardown). Its rank 0 keeps the port: not an orphan,
        # and neither is its ssh client, which holds the peer rank of that run.
        runs[0].kill()
        assert processes.is_alive(serving_rank) and processes.is_alive(failed_rank)
        only_the_failed_rank_0_is_an_orphan()
    finally:
        for run in runs:
            run.close()
