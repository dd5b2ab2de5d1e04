"""`recover` and `sweep-orphans` for real: the serve wrapper under supervisord in the
testbed head's namespaces serves the tiny model on two nodes; the service is stopped, the
seed's orphans are made (a plain `mlx.launch` of the model's rank script SIGKILLed while
its ranks run on both nodes, the peer's under an sshd session) beside stale tmp entries on
each node. A dry run touches nothing; one run of the remediator's engine, over real SSH and
the real node helpers, leaves no orphan, removes the stale entries, starts the service and
gets an answer from the model. Then, while the model serves, orphans made again are
removed by `sweep-orphans` from the orphan alert, the model answering throughout, with no
restart. The same scenario's recover run started by a real Alertmanager delivery to the
real remediator; and with the model pinned to JACCL (unavailable on Linux for real), the
recover run's fallback pins ring and the model answers across both nodes with --pipeline.
And the seed's final fix: a process of the model frozen on the peer (uninterruptible, it
survives SIGKILL) never leaves the service stopped: the run sweeps, names it with the node
to reboot, cleans, starts and verifies, and ends succeeded."""

from __future__ import annotations

import html
import json
import os
import random
import shlex
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, RunView
from mlx_medic.transport import SshTransport
from testbed import Cluster, processes
from testbed.freezer import frozen
from testbed.jaccl_rank import ALLOCATION_ERROR
from testbed.launch import LaunchHandle, mlx_launch_path, rank_pids, start_launch
from testbed.node_users import run_as
from tests.exporter.test_seed_orphan import RANK_SCRIPT, wait_ready
from tests.node.test_sweep_clean_testbed import aged, service_users, wait_until
from tests.remediator.conftest import (
    Alertmanager,
    Stack,
    alertmanager_config,
    am_time,
    basic,
    http,
    mlx_medic,
    runs_of,
    start_alertmanager,
)
from tests.remediator.conftest import wait_until as wait_for
from tests.remediator.engine_fakes import alert
from tests.serve.scenario import (
    MEDIC,
    NODES,
    Served,
    answers,
    jaccl_failure_logged,
    prepare,
    start_supervisord,
    supervised,
)
from tests.serve.test_serve_testbed import head_metrics, metric
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ROUTING = {"LLMModelDown": "recover", "MLXOrphanProcesses": "sweep-orphans"}


def edit_model(served: Served, **changes: Any) -> None:
    """Change the tiny model's inventory entry (`policy` merged into the model's own)."""
    data = yaml.safe_load(served.inventory.read_text())
    model = data["models"]["tiny"]
    model["policy"].update(changes.pop("policy", {}))
    model.update(changes)
    served.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


@dataclass
class Seeded:
    """The wrapper-served model beside the seed's rank script and a shared tmp dir."""

    cluster: Cluster
    tiny_model: Path
    served: Served
    script: Path  # the seed's rank script
    share: Path  # a tmp dir of the model, each node's own at the same path

    @property
    def port(self) -> int:
        return self.served.port

    def make_orphans_of_a_stopped_service(
        self,
    ) -> tuple[LaunchHandle, dict[str, list[int]], dict[str, Path]]:
        """Once the model serves: its service stopped (the model is down), then the seed's
        orphans (a plain mlx.launch of the rank script SIGKILLed while its ranks run on
        both nodes, the peer's under an sshd session) and an aged stale entry in the tmp
        dir of each node. (the launch, orphan pids by node, stale paths by node)"""
        cluster, served = self.cluster, self.served
        served.wait_serving()
        assert served.supervisorctl("stop", f"tiny-{served.token}").returncode == 0
        assert not answers(self.port)  # the model is down
        seed = start_launch(
            cluster,
            served.ring_hostfile,
            [
                cluster.python,
                str(self.script),
                "--model",
                str(self.tiny_model),
                "--port",
                str(self.port),
            ],
            launch_args=["--starting-port", str(random.randrange(42000, 52000, 20))],
        )
        wait_ready(seed, 2)
        nodes = [cluster.node(name) for name in NODES]
        orphans = {n.name: rank_pids(n, str(self.script)) for n in nodes}
        seed.kill()
        (peer_orphan,) = orphans["ai002"]
        assert processes.cmdline(processes.ppid(peer_orphan))[0].startswith("sshd:")
        stale = {}
        for node in nodes:
            here = node.host_path(self.share)
            here.mkdir(parents=True)
            service_users(here)
            (here / "tmpstale").mkdir()
            (here / "tmpstale" / "part").write_bytes(b"w" * 20000)
            stale[node.name] = aged(here / "tmpstale")
        return seed, orphans, stale


def seed_scenario(cluster: Cluster, tiny_model: Path) -> Seeded:
    """The serve scenario whose inventory names the seed's ranks and the shared tmp dir."""
    served = prepare(cluster, tiny_model)
    share = cluster.head.cache_mount / f"share-{served.token}"
    script = cluster.workdir / f"seed-{served.token}" / "serve.py"
    script.parent.mkdir()
    script.write_text(RANK_SCRIPT)
    edit_model(
        served,
        tmp_dirs=[str(share)],
        log_files=[str(served.log)],
        process_patterns={"rank": [rf"serve\.py --model \S+ --port {served.port}"]},
        policy={"restart_budget": 3, "backoff": 0},
    )
    return Seeded(cluster, tiny_model, served, script, share)


async def start_engine(
    served: Served,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
    routing: dict[str, str] | None = None,
) -> tuple[Path, Engine]:
    """The remediator's engine in this process over real SSH: (its config file, it)."""
    inventory = load_inventory(served.inventory)
    transport = SshTransport(inventory)
    ssh_transports.append(transport)
    config_file = tmp_path / "remediator.yml"
    settings: dict[str, Any] = {
        "inventory": str(served.inventory),
        "journal": str(tmp_path / "journal.sqlite"),
        "orphans_clean_window": "1s",  # no Prometheus here: sweep-orphans' checks, short
    }
    if routing is not None:
        settings["routing"] = {"playbooks": routing}
    config_file.write_text(yaml.safe_dump(settings))
    config = RemediatorConfig.model_validate(settings)
    engine = Engine(
        config, inventory, Journal(config.journal), transport, registry=CollectorRegistry()
    )
    engines.append(engine)
    await engine.start()
    return config_file, engine


@pytest.mark.least_privilege
async def test_one_recover_run_ends_the_seeds_orphans_cleans_and_serves_again(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    require_tool("supervisord")
    cluster = clean_cluster
    seeded = seed_scenario(cluster, tiny_model)
    served, script, token, port = seeded.served, seeded.script, seeded.served.token, seeded.port
    nodes = [cluster.node(name) for name in NODES]
    seed = None
    try:
        with supervised(served):
            seed, orphans, stale = seeded.make_orphans_of_a_stopped_service()

            config_file, engine = await start_engine(
                served, tmp_path, ssh_transports, engines, ROUTING
            )
            dry = engine.journal.get_run(await engine.run_manual("tiny", dry_run=True))
            assert dry is not None and dry.outcome == "planned"
            assert all(processes.is_alive(p) for pids in orphans.values() for p in pids)
            assert all(path.exists() for path in stale.values())  # the dry run touched nothing

            assert await engine.submit(alert(uuid.uuid4().hex[:16], "tiny")) == Disposition.STARTED
            await engine.wait_idle(600)
            run = engine.journal.list_runs()[0]
            assert run.outcome == "succeeded", (
                run.detail,
                [(s.name, s.outcome, s.detail) for s in run.steps],
            )
            assert [s.name for s in run.steps] == [
                "preflight",
                "stop-service",
                "sweep",
                "clean-tmp",
                "start-service",
                "verify",
            ]
            assert run.steps[2].targets == ["tiny on ai001", "tiny on ai002"]
            for node in nodes:
                for pid in orphans[node.name]:
                    wait_until(lambda: not processes.is_alive(pid), "an orphan to go")  # noqa: B023
                assert not stale[node.name].exists()
            assert answers(port)
            log = mlx_medic("log", "--config.file", str(config_file), "--model", "tiny").stdout
            for name in ("preflight", "stop-service", "sweep", "clean-tmp", "start-service"):
                assert name in log

            # While it serves: orphans of an older run again, removed with no restart.
            serving = served.record()
            assert serving is not None
            again = start_launch(
                cluster,
                served.ring_hostfile,
                [cluster.python, str(script), "--model", str(tiny_model), "--port", str(port)],
                env=cluster.env(MLX_MEDIC_RUN_ID=f"old-{token}", MLX_MEDIC_MODEL="tiny"),
                launch_args=["--starting-port", str(random.randrange(42000, 52000, 20))],
            )
            wait_ready(again, 2)
            orphans = {n.name: rank_pids(n, str(script)) for n in nodes}
            again.kill()
            answered: list[bool] = []
            probing = threading.Event()

            def probe() -> None:
                while not probing.is_set():
                    answered.append(answers(port))
                    probing.wait(0.5)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            try:
                for name in NODES:
                    assert await engine.submit(
                        alert(
                            uuid.uuid4().hex[:16],
                            "tiny",
                            alertname="MLXOrphanProcesses",
                            labels={"node": name},
                        )
                    ) in (Disposition.STARTED, Disposition.ABSORBED)
                await engine.wait_idle(300)
            finally:
                probing.set()
                prober.join(30)
            sweep = engine.journal.list_runs()[0]
            assert (sweep.playbook, sweep.outcome) == ("sweep-orphans", "succeeded"), (
                sweep.detail,
                [(s.name, s.outcome, s.output) for s in sweep.steps],
            )
            assert [(s.name, s.node) for s in sweep.steps] == [
                ("sweep-orphans", "ai001, ai002"),
                ("confirm-clean", "ai001, ai002"),
                ("verify", "ai001"),
            ]
            for node in nodes:
                for pid in orphans[node.name]:
                    wait_until(lambda: not processes.is_alive(pid), "an orphan to go")  # noqa: B023
            assert answered and all(answered)  # the model never stopped answering
            after = served.record()
            assert after is not None and after.run_id == serving.run_id  # no restart
            again.close()
    finally:
        if seed is not None:
            seed.close()
        served.close()


@pytest.mark.least_privilege
async def test_a_frozen_survivor_on_the_peer_is_named_and_the_service_is_started_anyway(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    """The model down (its service stopped) beside a process of it frozen on the peer (the
    model's MLX_RANK, MLX_MEDIC_MODEL and an older MLX_MEDIC_RUN_ID; frozen, it is in
    uninterruptible sleep and survives SIGKILL, as the seed's `Us+` ranks did): one real
    recover run stops, sweeps (the survivor survives), cleans, starts and verifies; the
    service is never left stopped, and the run ends succeeded naming the survivor and the
    node to reboot, with no escalation."""
    require_tool("supervisord")
    cluster = clean_cluster
    seeded = seed_scenario(cluster, tiny_model)
    served, token = seeded.served, seeded.served.token
    peer = cluster.node("ai002")
    env = cluster.env(
        MLX_RANK="1", MLX_MEDIC_MODEL="tiny", MLX_MEDIC_RUN_ID="20261130T000000Z-0ldrun00"
    )
    where = f"--inventory {served.inventory} --node ai001"
    holder = None
    try:
        with supervised(served):
            served.wait_serving()
            assert served.supervisorctl("stop", f"tiny-{token}").returncode == 0
            assert not answers(seeded.port)  # the model is down
            # Made now: the wrapper's own start sweep would have ended it at its start.
            holder = peer.spawn(
                [*run_as(cluster.node_user), cluster.python, "-c", "import time; time.sleep(3600)"],
                env=env,
            )
            survivor = peer.spawned_pid(holder)
            inside = peer.ns_pid_of(survivor)
            with frozen([survivor], f"survivor-{token}"):
                _, engine = await start_engine(served, tmp_path, ssh_transports, engines)
                assert (
                    await engine.submit(alert(uuid.uuid4().hex[:16], "tiny")) == Disposition.STARTED
                )
                await engine.wait_idle(600)
                run = engine.journal.list_runs()[0]
                steps = [(s.name, s.outcome) for s in run.steps]
                assert run.outcome == "succeeded", (
                    run.detail,
                    [(s.name, s.outcome, s.detail) for s in run.steps],
                    served.output()[-3000:],
                )
                assert steps == [
                    ("preflight", "ok"),
                    ("stop-service", "ok"),
                    ("sweep", "ok"),
                    ("clean-tmp", "ok"),
                    ("start-service", "ok"),
                    ("verify", "ok"),
                ]
                assert processes.is_alive(survivor)  # SIGKILL could not end it
                assert (
                    f"survivors left: ai002: pid {inside} (rank, state uninterruptible"
                    in run.detail
                )
                assert "reboot ai002 " in run.detail and run.next_action is None
                assert f"ai002: pid {inside} (rank, state uninterruptible" in run.steps[2].detail
                assert "the start goes on around them" in run.steps[2].detail
                (event,) = engine.journal.list_events(kind="unkillable")
                assert event.detail.startswith(
                    f"1 process(es) on ai002 survive SIGKILL (pids {inside}); reboot ai002 "
                )
                assert engine.m_unkillable.labels(model="tiny", node="ai002")._value.get() == 1
                assert engine.journal.list_events(kind="escalation") == []
                assert engine.journal.blocking_control("tiny") is None
                assert answers(seeded.port)
                # Never left stopped: the service runs, and the head keeps no stop record.
                assert "RUNNING" in served.supervisorctl("status", f"tiny-{token}").stdout
                status = json.loads(
                    served.head.run(f"{MEDIC} node service tiny status --json {where}").stdout
                )
                assert status["stopped_by"] is None
            # Thawed, the SIGKILL the sweep sent ends it (a reboot would have).
            wait_until(lambda: not processes.is_alive(survivor), "the survivor to go")
            assert answers(seeded.port)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(timeout=10)
        served.close()


START_SCRIPT = """\
#!/bin/sh
# The seed's start script: plain mlx.launch of mlx_lm.server over ring, no wrapper.
exec {launch} --hostfile {hostfile} --backend ring --starting-port {ring_port} -- \\
    {python} -m mlx_lm server --model {model} --host 127.0.0.1 --port {port} --pipeline
"""


async def test_one_recover_run_serves_again_a_model_started_by_its_own_script(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    """The seed's own failure: supervisord's stop SIGTERMs mlx.launch, which has no handler
    and dies leaving its ranks; the head's rank is killed too (the model is down), the
    peer's stays under its sshd session. With every sshd of the peer frozen, the run ends
    within its timeouts, escalated, nothing started; resumed, with the peer's rank frozen
    (state D: it survives SIGKILL), the next notification's run stops, sweeps, names the
    rank with the peer to reboot, starts the script again and gets a real answer: the
    survivor never leaves the service stopped; thawed, the rank goes."""
    require_tool("supervisord")
    cluster = clean_cluster
    served = prepare(cluster, tiny_model)
    token, port = served.token, served.port
    script = cluster.workdir / f"start-{token}.sh"
    script.write_text(
        START_SCRIPT.format(
            launch=mlx_launch_path(),
            hostfile=served.ring_hostfile,
            python=cluster.python,
            model=tiny_model,
            port=port,
            ring_port=random.randrange(42000, 52000, 20),
        )
    )
    rank_script = cluster.workdir / f"seed-{token}" / "serve.py"
    rank_script.parent.mkdir()
    rank_script.write_text(RANK_SCRIPT)
    data = yaml.safe_load(served.inventory.read_text())
    data["models"]["tiny"]["service"]["kind"] = "script"
    data["models"]["tiny"]["log_files"] = [str(served.log)]
    data["models"]["tiny"]["policy"]["start_timeout"] = "120s"
    data["models"]["tiny"]["process_patterns"] = {"rank": [rf"serve\.py --model \S+ --port {port}"]}
    data["models"]["tiny"]["policy"].update(restart_budget=3, backoff=0)
    served.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    daemon = start_supervisord(served, f"/bin/sh {script}", stopwaitsecs=20)
    seed = None
    try:
        wait_until(lambda: answers(port), "the script's model to answer", timeout=300)
        peer = cluster.node("ai002")
        # supervisord's stop: SIGTERM to mlx.launch, which has no handler for it. Its head
        # rank may stay listening on the port without answering: a sweep spares every
        # listener on the model's port (only the serve wrapper's start sweep ends one), so
        # here it crashes (SIGKILL): the model is down.
        assert served.supervisorctl("stop", f"tiny-{token}").returncode == 0
        for pid in served.head.find_pids(f"--port {port}"):
            if "mlx_lm" in " ".join(processes.cmdline(pid)):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not answers(port), "the model to be down")
        # The seed's orphans: an earlier launch of the rank script, SIGKILLed.
        seed = start_launch(
            cluster,
            served.ring_hostfile,
            [cluster.python, str(rank_script), "--model", str(tiny_model), "--port", str(port)],
            launch_args=["--starting-port", str(random.randrange(42000, 52000, 20))],
        )
        wait_ready(seed, 2)
        (peer_rank,) = rank_pids(peer, str(rank_script))
        seed.kill()
        assert processes.cmdline(processes.ppid(peer_rank))[0].startswith("sshd:")

        config_file, engine = await start_engine(served, tmp_path, ssh_transports, engines)

        async def one_run() -> RunView:
            assert await engine.submit(alert(uuid.uuid4().hex[:16], "tiny")) == Disposition.STARTED
            await engine.wait_idle(600)
            return engine.journal.list_runs()[0]

        def program_stopped() -> bool:
            return "STOPPED" in served.supervisorctl("status", f"tiny-{token}").stdout

        # The peer unreachable: every sshd process of it frozen (open connections too).
        with frozen(peer.find_pids("sshd"), f"sshd-{token}"):
            started = time.monotonic()
            run = await one_run()
            took = time.monotonic() - started
        assert run.outcome == "escalated" and [s.name for s in run.steps] == ["preflight"]
        assert run.steps[0].outcome == "unreachable" and "ai002" in run.detail
        assert took < engine.inventory.ssh.command_timeout + 60  # within its timeouts
        assert engine.m_unreachable.labels(model="tiny", node="ai002")._value.get() >= 1
        assert program_stopped()  # nothing was started
        mlx_medic("resume", "tiny", "--config.file", str(config_file))

        # The peer's rank frozen: uninterruptible, it survives SIGKILL; the start goes on.
        inside = peer.ns_pid_of(peer_rank)
        with frozen([peer_rank], f"rank-{token}"):
            run = await one_run()
            assert run.outcome == "succeeded", (
                run.detail,
                [(s.name, s.outcome, s.detail) for s in run.steps],
                served.output()[-3000:],
            )
            assert [s.name for s in run.steps] == [
                "preflight",
                "stop-service",
                "sweep",
                "start-service",
                "verify",
            ]
            assert (
                f"survivors left: ai002: pid {inside} (rank, state uninterruptible" in run.detail
                and "reboot ai002 " in run.detail
            )
            assert engine.m_unkillable.labels(model="tiny", node="ai002")._value.get() == 1
            assert processes.is_alive(peer_rank) and not program_stopped()
            assert answers(port)

        # Thawed: the SIGKILL the sweep sent ends it; the model serves on.
        wait_until(lambda: not processes.is_alive(peer_rank), "the peer's orphan to go")
        assert answers(port)

        # JACCL spent (the seed's end state): from now on the script's every start fails
        # with the PD error, and KeepAlive restarts it again and again. The run escalates
        # as soon as its start wrote the error, not after the 120 s start_timeout.
        pd_line = f"RuntimeError: {ALLOCATION_ERROR}"
        script.write_text(f"#!/bin/sh\necho {shlex.quote(pd_line)} >&2\nsleep 2\nexit 1\n")
        for pid in served.head.find_pids(f"--port {port}"):
            os.kill(pid, signal.SIGKILL)  # the model crashes; its restart is the failing script
        wait_until(lambda: not answers(port), "the model to be down")
        started = time.monotonic()
        run = await one_run()
        took = time.monotonic() - started
        outcomes = [(step.name, step.outcome) for step in run.steps]
        assert run.outcome == "escalated" and outcomes[-2:] == [
            ("verify", "failed"),
            ("escalate", "ok"),
        ], outcomes
        assert f"on ai001: {pd_line}" in run.steps[-2].detail
        assert "change its script (to ring with --pipeline" in run.detail
        assert took < 60, took  # the start_timeout is 120 s
    finally:
        if seed is not None:
            seed.close()
        served.supervisorctl("stop", f"tiny-{token}")
        daemon.kill()
        daemon.wait(timeout=10)
        served.close()


@pytest.mark.least_privilege
async def test_jaccl_unavailable_recover_pins_ring_and_two_nodes_answer_with_pipeline(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> None:
    """The model pinned to JACCL on its head: the serve wrapper under supervisord tries
    only JACCL, which fails on Linux for real, and writes the error to the service log.
    One recover run: its verify fails as soon as the wrapper counts the failed start (JACCL
    alone, ring untried), its pin-ring step pins ring on the head (durable:
    `node backend tiny show` says so), the restart serves on ring with --pipeline on
    both nodes, and the head's exporter says ring."""
    require_tool("supervisord")
    cluster = clean_cluster
    served = prepare(cluster, tiny_model)
    edit_model(
        served,
        log_files=[str(served.log)],
        policy={"restart_budget": 3, "backoff": 0, "start_timeout": "120s"},
    )
    where = f"--inventory {served.inventory} --node ai001"
    served.head.run(
        f"{MEDIC} node backend tiny set jaccl --by test-{served.token} --reason jaccl-only {where}"
    )
    try:
        with supervised(served):
            wait_until(
                lambda: jaccl_failure_logged(served.output()),
                "the wrapper's JACCL failure in the service log",
                timeout=300,
            )
            assert not answers(served.port)
            _, engine = await start_engine(served, tmp_path, ssh_transports, engines)
            assert await engine.submit(alert(uuid.uuid4().hex[:16], "tiny")) == Disposition.STARTED
            await engine.wait_idle(900)
            run = engine.journal.list_runs()[0]
            steps = [(s.name, s.outcome) for s in run.steps]
            assert run.outcome == "succeeded", (run.detail, steps, served.output()[-3000:])
            assert steps == [
                ("preflight", "ok"),
                ("stop-service", "ok"),
                ("sweep", "ok"),
                ("start-service", "ok"),
                ("verify", "failed"),
                ("pin-ring", "ok"),
                ("restart-service", "ok"),
                ("verify-ring", "ok"),
            ]
            # the wrapper's failed start on JACCL alone ended the verify, not its 120 s
            assert "failed on JACCL alone" in run.steps[4].detail, run.steps[4].detail
            assert (run.steps[4].duration or 999) < 100
            pin = run.steps[5]
            assert pin.targets == ["backend choice of tiny on ai001"]
            assert pin.detail.startswith("pinned tiny to ring on ai001: JACCL failed on ai00")

            shown = json.loads(
                served.head.run(f"{MEDIC} node backend tiny show --json {where}").stdout
            )
            assert (shown["choice"], shown["pinned"]) == ("ring", True)
            # the run and its replica: this process, on this machine
            assert (
                shown["by"] == f"remediator run {run.id} (pid {os.getpid()} on {engine.hostname})"
            )
            record = served.wait_serving()
            assert record.backend == "ring"
            for node in NODES:
                (rank,) = served.ranks(node, record.run_id)
                assert "--pipeline" in processes.cmdline(rank)
            assert answers(served.port)
            samples = head_metrics(served)
            assert metric(samples, "mlx_serve_backend", model="tiny", backend="ring") == 1
            assert metric(samples, "mlx_serve_backend_pinned", model="tiny", backend="ring") == 1
    finally:
        served.close()


async def test_a_real_alertmanager_delivery_starts_one_recover_run_that_ends_the_seeds_orphans(
    clean_cluster: Cluster,
    tiny_model: Path,
    stack: Stack,
    tmp_path: Path,
    managers: list[Alertmanager],
) -> None:
    """The seed's orphans on both nodes and stale tmp entries, the service stopped:
    Alertmanager delivers LLMModelDown to the real remediator, whose recover run leaves
    no orphan, removes the stale entries, starts the service and gets an answer; the
    journal, `mlx-medic log` and the on-call page show every step with its targets."""
    require_tool("supervisord")
    seeded = seed_scenario(clean_cluster, tiny_model)
    served = seeded.served
    seed = None
    try:
        with supervised(served):
            seed, orphans, stale = seeded.make_orphans_of_a_stopped_service()
            stack.inventory = served.inventory
            service = stack.start()
            manager = start_alertmanager(
                tmp_path / "am", alertmanager_config(service.url + "/alerts", stack.token_file)
            )
            managers.append(manager)
            manager.amtool(
                "alert",
                "add",
                "alertname=LLMModelDown",
                "model=tiny",
                "severity=critical",
                f"--start={am_time(datetime.now(UTC) - timedelta(seconds=5))}",
            )
            run = wait_for(
                lambda: [
                    r for r in runs_of(stack, "tiny") if r["outcome"] not in ("queued", "running")
                ],
                timeout=600,
                interval=2,
                what="the recover run to end",
            )[0]
            steps = run["steps"]
            assert (run["playbook"], run["outcome"]) == ("recover", "succeeded"), (
                run["detail"],
                steps,
            )
            assert run["trigger"].startswith("alert ")
            assert not run["dry_run"] and run["alertname"] == "LLMModelDown"
            assert [s["name"] for s in steps] == [
                "preflight",
                "stop-service",
                "sweep",
                "clean-tmp",
                "start-service",
                "verify",
            ]
            assert all(s["outcome"] == "ok" and s["targets"] for s in steps), steps
            assert steps[2]["targets"] == ["tiny on ai001", "tiny on ai002"]
            assert steps[3]["targets"] == [f"{seeded.share}/tmp*"]
            for name, pids in orphans.items():
                for pid in pids:
                    wait_until(
                        lambda: not processes.is_alive(pid),  # noqa: B023
                        f"the orphan {pid} on {name} to go",
                    )
                assert not stale[name].exists()
            assert answers(seeded.port)

            config = ["--config.file", str(service.config_file)]
            (logged,) = json.loads(mlx_medic("log", "--model", "tiny", "--json", *config).stdout)[
                "runs"
            ]
            assert [(s["name"], s["targets"]) for s in logged["steps"]] == [
                (s["name"], s["targets"]) for s in steps
            ]
            table = mlx_medic("log", "--model", "tiny", *config).stdout
            status, page = http("GET", service.url + "/", headers=basic())
            assert status == 200
            for step in steps:
                assert step["name"] in table
                assert step["name"] in page
                assert html.escape(f"targets: {', '.join(step['targets'])}") in page
    finally:
        if seed is not None:
            seed.close()
        served.close()
