"""`mlx-medic drain` and `undrain` around a node's reboot, on the testbed's simulated JACCL:
real sshd nodes, real mlx.launch, the tiny model on real mlx_lm.server under the serve
wrapper, supervisord as KeepAlive in each head, a real Alertmanager on 127.0.0.1 (cluster
port off).

ai002 carries two models: `alpha` is headed there (ai002, ai003), `beta` has a rank there
(ai001, ai002), and a frozen survivor of an earlier crashed `beta` holds a protection domain
on ai002. Its reboot is the testbed's: the node's namespaces end (the frozen groups thawed,
the survivor dies) and start again with a new boot id where the product reads it.
"""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.drain import silence_state
from mlx_medic.remediator.journal import Journal
from mlx_medic.serve.record import read_serve_record
from mlx_medic.state.node_drain import read_node_drain
from testbed import Cluster, free_port, processes
from testbed.faults import frozen_survivor
from testbed.jaccl_sim import JacclSim
from testbed.loop import Daemon, start_alertmanager
from tests.serve.scenario import SUPERVISORD_CONTROL, answers, as_deployed, login, wait_until
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

DRAINED = "ai002"
PLACEMENT = {"alpha": ["ai002", "ai003"], "beta": ["ai001", "ai002"]}
PROGRAM = """\
[program:{label}]
command={medic} serve {model} --inventory {inventory}
environment=PATH="{path}",HF_HUB_OFFLINE="1"
directory={workdir}
autorestart=true
startsecs=0
stopsignal=TERM
stopwaitsecs=60
redirect_stderr=true
stdout_logfile={log}
"""


def medic_command(work: Path) -> str:
    """mlx-medic as every node runs it here: this checkout's code (the venv's console
    script with this repository first on the path), for the helpers and the services."""
    script = work / "mlx-medic"
    script.write_text(
        f'#!/bin/sh\nexport PYTHONPATH={REPO}\nexec {sys.executable} -m mlx_medic.cli "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@dataclass
class TwoModels:
    cluster: Cluster
    work: Path
    medic_command: str
    inventory: Path
    config: Path  # the remediator's
    journal: Path
    ports: dict[str, int]
    labels: dict[str, str]
    supervisords: dict[str, subprocess.Popen[bytes]]

    def conf(self, model: str) -> Path:
        return self.work / f"{model}.supervisord.conf"

    def boot_supervisord(self, model: str) -> None:
        """The model's KeepAlive in its head, as the head's boot starts it."""
        head = self.cluster.node(PLACEMENT[model][0])
        env = self.cluster.env(HF_HUB_OFFLINE="1")
        conf = SUPERVISORD_CONTROL + PROGRAM.format(
            label=self.labels[model],
            medic=self.medic_command,
            model=model,
            inventory=self.inventory,
            path=env["PATH"],
            workdir=self.cluster.workdir,
            log=self.work / f"{model}.log",
        )
        if self.cluster.node_user is not None:
            conf += f"user={self.cluster.node_user.name}\n"
        self.conf(model).write_text(conf)
        self.supervisords[model] = head.spawn(
            ["supervisord", "-n", "-c", str(self.conf(model))],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def record(self, model: str) -> Any:
        return read_serve_record(self.cluster.node(PLACEMENT[model][0]).state_dir, model)

    def serving(self, model: str) -> str | None:
        """The backend the model serves on, once its record says serving and it answers."""
        record = self.record(model)
        if record is None or record.state != "serving" or not answers(self.ports[model]):
            return None
        return str(record.backend)

    def ranks(self, model: str) -> list[int]:
        found = []
        for node in self.cluster.nodes:
            for pid in node.find_pids(f"--port {self.ports[model]}"):
                cmd = processes.cmdline(pid)
                if "mlx_lm" in cmd and "server" in cmd and processes.state(pid) != "D":
                    found.append(pid)
        return found

    def status(self, model: str) -> str:
        head = self.cluster.node(PLACEMENT[model][0])
        return head.run(
            f"supervisorctl -c {self.conf(model)} status {self.labels[model]}",
            timeout=60,
            check=False,
        ).stdout

    def medic(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.medic_command, *args, "--config.file", str(self.config)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env=self.cluster.env(),
        )

    def events(self, kind: str) -> list[str]:
        journal = Journal(self.journal)
        try:
            return [e.detail for e in reversed(journal.list_events(kind=kind, limit=100))]
        finally:
            journal.close()

    def runs(self) -> list[tuple[str, str, str]]:
        journal = Journal(self.journal)
        try:
            return [(r.playbook, r.model, r.outcome) for r in reversed(journal.list_runs())]
        finally:
            journal.close()


@pytest.fixture
def alertmanager(clean_cluster: Cluster) -> Iterator[str]:
    require_tool("prometheus-alertmanager")
    work = clean_cluster.workdir / f"am-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    config = work / "alertmanager.yml"
    config.write_text(
        yaml.safe_dump({"route": {"receiver": "none"}, "receivers": [{"name": "none"}]})
    )
    port = free_port()
    daemon: Daemon = start_alertmanager(work, config, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        daemon.stop()


@pytest.fixture
def two(clean_cluster: Cluster, tiny_model: Path, releasing_sim: JacclSim) -> Iterator[TwoModels]:
    require_tool("supervisord")
    cluster = clean_cluster
    work = cluster.workdir / f"drain-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    inventory = work / "inventory.yaml"
    medic = medic_command(work)
    ports = {name: free_port() for name in PLACEMENT}
    labels = {name: f"{name}-{work.name}" for name in PLACEMENT}
    models = []
    for name, nodes in PLACEMENT.items():
        service: dict[str, Any] = {
            "manager": "supervisord",
            "label": labels[name],
            "config": str(work / f"{name}.supervisord.conf"),
        }
        serve = {
            **releasing_sim.serve_settings(),
            "starting_port": random.randrange(42000, 52000, 20),
            "smoke_timeout": "90s",
            "lease": "10s",
            "identity_file": str(cluster.identity),
        }
        if cluster.node_user is not None:
            service.update({"user": cluster.node_user.name, "sudo": True})
            serve["identity_file"] = str(cluster.node_user.serve_identity)
        models.append(
            {
                "name": name,
                "model": str(tiny_model),
                "nodes": nodes,
                "port": ports[name],
                "service": service,
                "backends": {
                    "jaccl": {
                        "hostfile": str(
                            cluster.hostfile(work / f"{name}.jaccl.json", nodes, backend="jaccl")
                        )
                    },
                    "ring": {
                        "hostfile": str(cluster.hostfile(work / f"{name}.ring.json", nodes)),
                        "pipeline": True,
                    },
                },
                "serve_args": {"prefill-step-size": 256},
                "serve": serve,
                "policy": {
                    "kill_grace": "3s",
                    "stop_timeout": "40s",
                    "start_timeout": "5m",
                    "pd_reserve": 3,
                },
            }
        )
    data = yaml.safe_load(cluster.inventory_yaml(models, **login(cluster)))
    for node in data["nodes"].values():
        node.update({"medic_command": medic, "medic_config": str(inventory)})
    if cluster.node_user is not None:
        as_deployed(cluster, data)
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    cluster.deploy(inventory)
    config = work / "remediator.yml"
    journal = work / "journal.sqlite"
    config.write_text(yaml.safe_dump({"inventory": str(inventory), "journal": str(journal)}))
    setup = TwoModels(cluster, work, medic, inventory, config, journal, ports, labels, {})
    try:
        yield setup
    finally:
        for model, daemon in setup.supervisords.items():
            setup.cluster.node(PLACEMENT[model][0]).run(
                f"supervisorctl -c {setup.conf(model)} stop {labels[model]}",
                timeout=90,
                check=False,
            )
            daemon.kill()
            daemon.wait(timeout=10)


def test_drain_stops_both_models_of_the_node_and_undrain_brings_both_back_on_jaccl_after_its_reboot(
    two: TwoModels, releasing_sim: JacclSim, alertmanager: str, tiny_model: Path
):
    cluster = two.cluster
    # The seed's survivor: beta's earlier run crashed, its rank on ai002 frozen (state D).
    stuck = frozen_survivor(
        cluster,
        releasing_sim,
        model=tiny_model,
        port=two.ports["beta"],
        hostfile=two.work / "beta.jaccl.json",
        starting_port=random.randrange(53000, 60000, 20),
        log=two.work / "earlier.log",
    )
    for model in PLACEMENT:
        two.boot_supervisord(model)
    for model in PLACEMENT:
        wait_until(lambda m=model: two.serving(m) == "jaccl", 300, f"{model} serving on jaccl")

    drained = two.medic("drain", DRAINED, "--yes", "--silence", "--alertmanager.url", alertmanager)
    said = drained.stdout
    assert drained.returncode == 0, said + drained.stderr
    # shown first: both models, each one's other nodes and backends, the survivor's domains
    assert "model alpha: head ai002, other nodes ai003; backend now jaccl, meanwhile none" in said
    assert "model beta: head ai001, other nodes ai001; backend now jaccl, meanwhile none" in said
    assert "survivors of SIGKILL on ai002: 1, holding 1" in said
    assert f"pid {cluster.node(DRAINED).ns_pid_of(stuck)} (model beta, jaccl backend)" in said
    # both paused, stopped, swept: no rank of either left anywhere (the frozen one aside)
    assert "paused automatic remediation of alpha" in said and "of beta" in said
    for model in PLACEMENT:
        assert "STOPPED" in two.status(model), two.status(model)
        assert two.ranks(model) == []
        assert not answers(two.ports[model])
    assert processes.state(stuck) == "D"
    assert [
        o
        for o in releasing_sim.orphans()
        if o.host_pid is not None and processes.is_alive(o.host_pid) and o.host_pid != stuck
    ] == []
    on_node = read_node_drain(cluster.node(DRAINED).state_dir)  # the node's own record
    assert on_node is not None and on_node.models == ("alpha", "beta"), on_node
    (drain,) = two.events("drain")
    silences = drain.split('"silences": [')[1].split("]")[0].replace('"', "").split(", ")
    assert len(silences) == 3  # the node's, alpha's, beta's
    assert all(silence_state(alertmanager, s) == "active" for s in silences)

    # Not rebooted yet: undrain says so and does nothing.
    early = two.medic("undrain", DRAINED)
    assert early.returncode == 1 and "has not rebooted since the drain" in early.stderr
    assert "STOPPED" in two.status("beta")

    # The reboot: ai002's namespaces end and start again (new boot id, pools emptied); its
    # boot starts alpha's KeepAlive again, as launchd would.
    old_boot = cluster.node(DRAINED).boot_id
    cluster.reboot(DRAINED)
    assert cluster.node(DRAINED).boot_id != old_boot
    assert not processes.is_alive(stuck)
    two.supervisords.pop("alpha").wait(timeout=10)
    two.boot_supervisord("alpha")

    undrained = two.medic("undrain", DRAINED)
    assert undrained.returncode == 0, undrained.stdout + undrained.stderr
    for model in PLACEMENT:
        assert two.serving(model) == "jaccl", two.record(model)
    assert f"rebooted: boot {old_boot} -> {cluster.node(DRAINED).boot_id}" in undrained.stdout
    assert all(silence_state(alertmanager, s) == "expired" for s in silences)
    assert read_node_drain(cluster.node(DRAINED).state_dir) is None
    # the journal holds each step
    assert two.runs()[-4:] == [
        ("drain", "alpha", "succeeded"),
        ("drain", "beta", "succeeded"),
        ("undrain", "alpha", "succeeded"),
        ("undrain", "beta", "succeeded"),
    ]
    steps = two.events("undrain-step")
    assert steps[0].startswith(f"ai002: ai002 rebooted: boot {old_boot}")
    assert [s for s in steps if "expired silence" in s] == [
        f"ai002: expired silence {s}" for s in silences
    ]
    (end,) = two.events("undrain")
    assert end == "ai002 undrained: alpha, beta back and verified"
