"""One served model on the testbed for the serve wrapper's tests: the tiny model on ai001
(head) and ai002, JACCL (which fails on Linux for real) and ring with `--pipeline`, a
unique token, HTTP port and ring ports; the wrapper run directly inside the head or by a
supervisord inside the head's namespaces (KeepAlive)."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlx_medic.serve.record import ServeRecord, read_serve_record
from testbed import Cluster, SimNode, free_port, processes
from testbed.node_users import run_as
from tests.node.inventories import checkout_shim
from tests.node.test_service_helper import SUPERVISORD_CONTROL

MEDIC = str(Path(sys.executable).parent / "mlx-medic")
NODES = ("ai001", "ai002")

SUPERVISORD_CONF = (
    SUPERVISORD_CONTROL
    + """\
[program:tiny-{token}]
command={medic} serve tiny --inventory {inventory}
environment=PATH="{path}",HF_HUB_OFFLINE="1"
directory={workdir}
autorestart=true
startsecs=0
stopsignal=TERM
stopwaitsecs={stopwaitsecs}
redirect_stderr=true
stdout_logfile={log}
"""
)


def start_supervisord(
    served: Served, command: str, *, stopwaitsecs: int
) -> subprocess.Popen[bytes]:
    """supervisord in the head's namespaces, the model's program running `command` (lines
    after its first are more settings of the program) instead of the serve wrapper."""
    assert served.conf is not None
    env = served.cluster.env(HF_HUB_OFFLINE="1")
    served.conf.write_text(
        SUPERVISORD_CONF.replace(
            "command={medic} serve tiny --inventory {inventory}", f"command={command}"
        ).format(
            token=served.token,
            path=env["PATH"],
            workdir=served.cluster.workdir,
            stopwaitsecs=stopwaitsecs,
            log=served.log,
        )
    )
    return served.head.spawn(["supervisord", "-n", "-c", str(served.conf)], env=env)


@dataclass
class Served:
    cluster: Cluster
    token: str
    port: int
    inventory: Path
    ring_hostfile: Path
    jaccl_hostfile: Path
    log: Path  # the service log (supervisord's stdout_logfile, or a direct run's output)
    spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)
    conf: Path | None = None

    @property
    def head(self) -> SimNode:
        return self.cluster.node("ai001")

    def record(self) -> ServeRecord | None:
        return read_serve_record(self.head.state_dir, "tiny")

    def serve_argv(self) -> list[str]:
        """The wrapper as its service runs it: as the node user in the three-user mode."""
        return [
            *run_as(self.cluster.node_user),
            MEDIC,
            "serve",
            "tiny",
            "--inventory",
            str(self.inventory),
        ]

    def start_direct(self, log: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
        """`mlx-medic serve tiny` inside the head, output to `log`; (nsenter, wrapper pid)."""
        with (log or self.log).open("ab") as out:
            popen = self.head.spawn(
                self.serve_argv(),
                env=self.cluster.env(HF_HUB_OFFLINE="1"),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.cluster.workdir),
            )
        self.spawned.append(popen)
        return popen, self.head.spawned_pid(popen)

    def run_direct(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A wrapper run to its end inside the head (for starts that must fail)."""
        popen = self.head.spawn(
            self.serve_argv(),
            env=self.cluster.env(HF_HUB_OFFLINE="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(self.cluster.workdir),
        )
        self.spawned.append(popen)
        out, err = popen.communicate(timeout=timeout)
        return subprocess.CompletedProcess(popen.args, popen.returncode, out.decode(), err.decode())

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_serving(self, timeout: float = 300.0, run_id: str | None = None) -> ServeRecord:
        """Until the record says serving (a run other than `run_id`'s when given) and the
        model answers."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.record()
            if (
                record is not None
                and record.state == "serving"
                and record.run_id != run_id
                and answers(self.port)
            ):
                return record
            assert time.monotonic() < deadline, f"not serving:\n{self.output()[-4000:]}"
            time.sleep(0.5)

    def ranks(self, node: str, run_id: str | None = None) -> list[int]:
        """Host pids of the model's mlx_lm.server ranks on `node` (of run `run_id`)."""
        found = []
        for pid in self.cluster.node(node).find_pids(f"--port {self.port}"):
            cmd = processes.cmdline(pid)
            if "mlx_lm" not in cmd or "server" not in cmd or "mlx_medic.serve.guard" in cmd:
                continue
            if run_id is None or environ(pid).get("MLX_MEDIC_RUN_ID") == run_id:
                found.append(pid)
        return found

    def launchers(self) -> list[int]:
        return [
            pid
            for pid in self.head.host_pids()
            if any(part.endswith("mlx.launch") for part in processes.cmdline(pid)[:2])
        ]

    def supervisorctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.conf is not None
        return self.head.run(
            f"supervisorctl -c {self.conf} {' '.join(args)}", timeout=120, check=False
        )

    def close(self) -> None:
        for popen in self.spawned:
            if popen.poll() is None:
                popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(
        e.decode(errors="replace").partition("=")[::2] for e in raw.split(b"\0") if b"=" in e
    )


def answers(port: int) -> bool:
    """A real chat completion from the model (what the health probe asks)."""
    from mlx_medic.health import probe_model

    return probe_model("127.0.0.1", port, timeout=20).up


def wait_until(
    predicate: Any, timeout: float, what: str, explain: Callable[[], str] | None = None
) -> float:
    """Seconds it took; AssertionError naming `what` (and what `explain` says) after
    `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start >= timeout:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"{what} not within {timeout:g}s{detail}")
        time.sleep(0.2)
    return time.monotonic() - start


def prepare(
    cluster: Cluster,
    tiny_model: Path,
    *,
    ring_hostfile: Path | None = None,
    extra_model: dict[str, Any] | None = None,
    serve: dict[str, Any] | None = None,
    checkout_on_nodes: bool = False,
) -> Served:
    """`serve`: settings over the scenario's (which turn the wrapper's own relaunch off, so
    a failure ends the wrapper as a test of one start expects). `checkout_on_nodes`: the
    helpers that ssh runs on the nodes, and the ranks, import this checkout's mlx_medic
    (the installed one may be another checkout's: ssh passes no PYTHONPATH)."""
    token = uuid.uuid4().hex[:8]
    work = cluster.workdir / f"serve-{token}"
    work.mkdir()
    port = free_port()
    ring = ring_hostfile or cluster.hostfile(work / "ring.json", list(NODES))
    jaccl = cluster.hostfile(work / "jaccl.json", list(NODES), backend="jaccl")
    inventory = work / "inventory.yaml"
    conf = work / "supervisord.conf"
    medic, python = MEDIC, cluster.python
    if checkout_on_nodes:
        medic, python = (
            str(checkout_shim(work / f"{Path(program).name}-checkout", program))
            for program in (MEDIC, cluster.python)
        )
    model = {
        "name": "tiny",
        "model": str(tiny_model),
        "nodes": list(NODES),
        "port": port,
        "service": {"manager": "supervisord", "label": f"tiny-{token}", "config": str(conf)},
        "backends": {
            "jaccl": {"hostfile": str(jaccl)},
            "ring": {"hostfile": str(ring), "pipeline": True},
        },
        "serve_args": {"prefill-step-size": 256},
        "serve": {
            "python": python,
            "starting_port": random.randrange(42000, 52000, 20),
            "smoke_timeout": "90s",
            "lease": "10s",
            "identity_file": str(cluster.identity),
            "relaunch_limit": 0,
            **(serve or {}),
        },
        "policy": {"kill_grace": "3s", "stop_timeout": "40s", "start_timeout": "5m"},
        **(extra_model or {}),
    }
    user = cluster.node_user
    if user is not None:  # three-user mode: as deployed (testbed/node_users.py)
        model["service"].update({"user": user.name, "sudo": True})
        model["serve"]["identity_file"] = str(user.serve_identity)
    data = yaml.safe_load(cluster.inventory_yaml([model], **login(cluster)))
    for node in data["nodes"].values():
        node.update({"medic_command": medic, "medic_config": str(inventory)})
    if user is not None:
        as_deployed(cluster, data)
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    cluster.deploy(inventory)
    return Served(cluster, token, port, inventory, ring, jaccl, work / "service.log", conf=conf)


def login(cluster: Cluster) -> dict[str, Any]:
    """`inventory_yaml`'s login user: the node user in the three-user mode, else root."""
    return {"login_user": cluster.node_user.name} if cluster.node_user else {}


def as_deployed(cluster: Cluster, data: dict[str, Any]) -> None:
    """Three-user mode: the remediator logs in with its own key from this machine
    (127.0.0.1), and so do the heads' wrappers (the nodes share its loopback)."""
    data["ssh"].update(
        {"identity_file": str(cluster.remediator_identity), "remediator_addresses": ["127.0.0.1"]}
    )
    for node in data["nodes"].values():
        node["source_addresses"] = ["127.0.0.1"]


@contextlib.contextmanager
def supervised(served: Served) -> Iterator[subprocess.Popen[bytes]]:
    """supervisord inside the head's namespaces running the wrapper as KeepAlive."""
    assert served.conf is not None
    env = served.cluster.env(HF_HUB_OFFLINE="1")
    conf = SUPERVISORD_CONF.format(
        token=served.token,
        medic=MEDIC,
        inventory=served.inventory,
        path=env["PATH"],
        workdir=served.cluster.workdir,
        stopwaitsecs=60,
        log=served.log,
    )
    if served.cluster.node_user is not None:  # the wrapper runs as the node user
        conf += f"user={served.cluster.node_user.name}\n"
    served.conf.write_text(conf)
    daemon = served.head.spawn(
        ["supervisord", "-n", "-c", str(served.conf)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield daemon
    finally:
        served.supervisorctl("stop", f"tiny-{served.token}")
        daemon.kill()  # the host-side nsenter; clean_cluster ends what ran in the node
        daemon.wait(timeout=10)


def jaccl_failure_logged(output: str) -> bool:
    return "jaccl did not start: jaccl failed on" in output


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
