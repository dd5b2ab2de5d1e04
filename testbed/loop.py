"""The whole loop on one machine, as `mlx-medic render` deploys it (test-only).

`start_loop(cluster, sim, model_dir, ...)` stands up, on a three-user testbed
(`Cluster.node_user`) with the simulated JACCL seam (`testbed/jaccl_sim.py`):

- the model's service inside the head: supervisord as KeepAlive behind `testbed.throttle`
  (launchd's ThrottleInterval), running one of the seed's start scripts
  (`testbed/seed_fixes.py`) or `mlx-medic serve` as the node's login user;
- an exporter per node, as root inside the node, with the argv of the rendered systemd
  unit (listening on the node's own loopback address);
- Debian's Prometheus with the rendered prometheus.yml and rules (`--prometheus.interval`,
  `--rules.for`, `--rules.interval`: the renderer's overrides; the shipped defaults stay);
- Debian's Alertmanager with the rendered alertmanager.yml (`--alertmanager.group-wait`,
  `--alertmanager.group-interval`; on-call pointed at a sink this module records);
- the remediator (`mlx-medic remediator`) with its own key, which the nodes accept only
  through the rendered authorized_keys (and the head's rendered sudoers file).

Every server listens on 127.0.0.1 or on a node's own loopback address; Alertmanager's
cluster port is off. Everything is stopped by pid at `close()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import yaml

from mlx_medic.inventory.fields import parse_duration
from testbed import processes
from testbed.closing import ClosedOnExit
from testbed.cluster import Cluster, SimNode, TestbedError
from testbed.jaccl_sim import JacclSim
from testbed.keepalive import KeepAlive, keep_alive
from testbed.net import free_port, wait_listening
from testbed.seed_fixes import SeedFix, SeedModel, write_seed_script

MEDIC = str(Path(sys.executable).parent / "mlx-medic")
LAUNCH = str(Path(sys.executable).parent / "mlx.launch")
TOKEN = "loop-" + uuid.uuid4().hex
ONCALL_USER = "oncall"  # on-call's browser: basic auth, the token as its password
ServiceKind = SeedFix | Literal["serve"]  # a seed start script, or `mlx-medic serve`
MODEL = "tiny"
DASHBOARD = Path(__file__).resolve().parents[1] / "grafana/dashboards/mlx-medic-cluster.json"

# The rules' `for:` in the loop: long enough that a first start of the tiny model on three
# nodes (about 20 s here) is not a page, short enough for a test. Every expression and
# label stays the shipped one.
SHORT_FOR = {
    "LLMModelDown": "30s",
    "MLXOrphanProcesses": "5s",
    "MLXOrphanProcessesUninterruptible": "5s",
    "MLXServingOnRingFallback": "5s",
    "MLXUnkillableSurvivors": "5s",
}


@dataclass
class LoopSettings:
    service: ServiceKind = "serve"
    remediator: bool = True
    throttle: float = 3.0  # the KeepAlive stand-in's spawn interval
    interval: str = "1s"  # Prometheus's scrape and evaluation interval
    rules_for: dict[str, str] = field(default_factory=lambda: dict(SHORT_FOR))
    group_wait: str = "1s"
    group_interval: str = "2s"
    reserve: int = 2  # policy.pd_reserve against the simulator's small pools
    nodes: tuple[str, ...] = ("ai001", "ai002", "ai003")
    policy: dict[str, Any] = field(default_factory=dict)  # over the loop's own
    # the model's process_patterns.rank, `{port}` replaced by the model's port
    rank_patterns: tuple[str, ...] = ()
    # run once the nodes are ready, before any part of mlx-medic runs (the seed's faults
    # from before it was deployed)
    before_service: Callable[[Loop], None] | None = None


class OncallSink:
    """On-call's webhook: records every Alertmanager notification (on 127.0.0.1)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                with contextlib.suppress(ValueError):
                    sink.received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/oncall"

    def alertnames(self) -> set[str]:
        return {
            alert["labels"].get("alertname", "")
            for note in self.received
            for alert in note.get("alerts", [])
            if alert.get("status") == "firing"
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Daemon:
    """A process this module started on the host, or inside a node (its host pid)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    pid: int  # the process itself (for a node's, its host pid, not nsenter's)

    def stop(self) -> None:
        processes.kill_quietly(self.pid, 15)
        if self.pid != self.popen.pid:
            processes.kill_quietly(self.popen.pid, 15)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            processes.kill_quietly(self.pid, 9)
            self.popen.kill()
            self.popen.wait(timeout=10)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def rechecked(kind: str, fingerprint: str | None, run_id: int | None) -> bool:
    """A run's re-check finding its alert no longer holds: journaled `stale` for the run,
    beside the alert's own `started` (remediator/engine.py `_stale`), not for an alert."""
    return kind == "stale" and fingerprint is None and run_id is not None


@dataclass
class Loop(ClosedOnExit):
    cluster: Cluster
    sim: JacclSim
    settings: LoopSettings
    workdir: Path
    port: int
    inventory: Path
    rendered: Path
    journal: Path
    oncall: OncallSink
    service_dir: Path  # the node user's: the service's log and throttle stamp
    daemons: list[Daemon] = field(default_factory=list)
    service: KeepAlive | None = None
    command: list[str] = field(default_factory=list)  # the service's program
    program: str = ""  # its supervisord program name (the inventory's service.label)
    remediator_port: int = 0
    prometheus_port: int = 0
    alertmanager_port: int = 0

    @property
    def remediator_config(self) -> Path:
        return self.workdir / "remediator.yml"

    @property
    def oncall_page(self) -> str:
        """The remediator's on-call page, signed in as on-call's browser is (basic auth)."""
        return f"http://{ONCALL_USER}:{TOKEN}@127.0.0.1:{self.remediator_port}/"

    def remediate(self, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """On-call's `mlx-medic remediate` of the model: its playbook run by hand with the
        remediator's config, journal and key, as a person on the remediator's host runs it."""
        return subprocess.run(
            [MEDIC, "remediate", MODEL, "--config.file", str(self.remediator_config)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # --- what a test reads -------------------------------------------------------------
    def answers(self) -> bool:
        from mlx_medic.health import probe_model

        return probe_model("127.0.0.1", self.port, timeout=5.0).up

    def wait_answer(self, limit: float) -> float | None:
        """Seconds until the model answers (a real one-token completion), or None."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            if self.answers():
                return time.monotonic() - start
            time.sleep(0.1)
        return None

    def pools(self) -> dict[str, int]:
        """Domains in use per node, from the simulator's pools (the truth)."""
        return {node: self.sim.in_use(node) for node in self.settings.nodes}

    def ledgers(self) -> dict[str, int]:
        """What the product's ledger counted spent per node this boot (processes holding
        or having held domains: its estimate)."""
        from mlx_medic.state.ledger import read_ledger

        spent = {}
        for name in self.settings.nodes:
            node = self.cluster.node(name)
            spent[name] = read_ledger(node.state_dir, name, node.boot_id).debt
        return spent

    def orphans(self) -> dict[str, int]:
        """The model's orphans per node, as the exporters publish them."""
        found: dict[str, int] = {node: 0 for node in self.settings.nodes}
        for sample in self.query(f'mlx_orphan_processes{{model="{MODEL}"}}'):
            node = sample["metric"].get("node", "")
            found[node] = found.get(node, 0) + int(float(sample["value"][1]))
        return found

    def orphans_stay_zero(self, scrapes: int = 2) -> bool:
        """Whether every node's exporter published no orphan of the model in each of its
        last `scrapes` scrapes, none of them missed. `orphans()` reads one instant, where a
        node whose last scrape failed (a slow scrape on a busy machine: the timeout is the
        interval) has no sample at all and reads as 0; here such a node is not settled."""
        window = (scrapes + 0.5) * parse_duration(self.settings.interval)
        stamps: dict[str, set[float]] = {node: set() for node in self.settings.nodes}
        selector = f'mlx_orphan_processes{{model="{MODEL}"}}[{int(window * 1000)}ms]'
        for series in self.query(selector):
            node = series["metric"].get("node", "")
            for stamp, value in series["values"]:
                if float(value) != 0:
                    return False
                stamps.setdefault(node, set()).add(float(stamp))
        return all(len(seen) >= scrapes for seen in stamps.values())

    def dashboard_orphans(self) -> dict[str, float]:
        """Each orphan panel of the cluster dashboard (grafana/), its query with the
        variables set to "All" as Grafana expands them: the sum of what it shows now."""
        from testbed.dashboard_queries import expand, panel_targets

        queries = [
            expand(expr)
            for _, expr in panel_targets(json.loads(DASHBOARD.read_text()))
            if "mlx_orphan_processes" in expr
        ]
        return {expr: sum(float(r["value"][1]) for r in self.query(expr)) for expr in queries}

    def alerts_unjournaled(self) -> int:
        """Alerts the remediator's webhook took in (`mlx_medic_alerts_received_total`)
        less the journal's events that record what it did with one (each gets one): 0
        when no record was lost. The count is read before and after the journal, and
        again until no alert came in between (Alertmanager may repeat one at any time)."""
        from mlx_medic.remediator.alerts import Disposition
        from mlx_medic.remediator.journal import Journal

        kinds = {str(d) for d in Disposition}
        for _attempt in range(10):
            received = self._alerts_received()
            journal = Journal(self.journal)
            try:
                events = [
                    e
                    for e in journal.list_events(limit=100_000)
                    if e.kind in kinds and not rechecked(e.kind, e.fingerprint, e.run_id)
                ]
            finally:
                journal.close()
            if self._alerts_received() == received:
                return received - len(events)
        raise RuntimeError("alerts kept arriving: cannot compare the journal with them")

    def _alerts_received(self) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.remediator_port}/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        from prometheus_client.parser import text_string_to_metric_families

        return int(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                if family.name == "mlx_medic_alerts_received"
                for sample in family.samples
                if sample.name.endswith("_total")
            )
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.prometheus("query", query=promql)
        return list(data["result"])

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        return [
            alert
            for alert in self.prometheus("alerts")["alerts"]
            if alert["labels"].get("alertname") == alertname and alert["state"] == "firing"
        ]

    def runs(self) -> list[dict[str, Any]]:
        """The remediator's journaled runs with their steps, oldest first, as `to_dict`
        gives them but with the journal's Unix times (`queued_at`, `started_at`,
        `ended_at`, a step's too): the loop's measurements subtract them, to the
        microsecond, where on-call reads ISO 8601 to the second."""
        from mlx_medic.remediator.journal import Journal

        if not self.journal.exists():
            return []
        journal = Journal(self.journal)
        try:
            return [
                {
                    **run.to_dict(),
                    "queued_at": run.queued_at,
                    "started_at": run.started_at,
                    "ended_at": run.ended_at,
                    "steps": [
                        {**step.to_dict(), "started_at": step.started_at, "ended_at": step.ended_at}
                        for step in run.steps
                    ],
                }
                for run in reversed(journal.list_runs(limit=1000))
            ]
        finally:
            journal.close()

    def reboot(self, *names: str) -> None:
        """The nodes "reboot" (testbed: every process ended, frozen ones thawed first, their
        pools cleared, new boot ids); their exporters start again, and the model's service
        if the head was among them, as launchd would at boot."""
        for name in names:
            self.cluster.reboot(name)
        for index, daemon in enumerate(self.daemons):
            if daemon.name.removeprefix("exporter ") in names:
                with contextlib.suppress(Exception):
                    daemon.stop()
                self.daemons[index] = _start_exporter(self, daemon.name.removeprefix("exporter "))
        if self.cluster.head.name in names and self.service is not None:
            self.service.close()  # its supervisord died with the node
            self.service = _start_service(self)

    def backend(self) -> str | None:
        """The backend the serve wrapper's record on the head says it serves on."""
        from mlx_medic.serve.record import read_serve_record

        record = read_serve_record(self.cluster.head.state_dir, MODEL)
        return record.backend if record is not None else None

    def crash(self) -> list[int]:
        """The seed's fault: mlx.launch and the head's rank SIGKILLed together."""
        from testbed.faults import seed_crash

        return seed_crash(self.cluster, self.port)

    def logs(self) -> str:
        parts = [f"--- {d.name} ({d.log}):\n{d.tail()}" for d in self.daemons]
        if self.service is not None:
            tail = "\n".join(self.service.output().splitlines()[-30:])
            parts.append(f"--- service ({self.service.log}):\n{tail}")
        return "\n".join(parts)

    def prometheus(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise TestbedError(f"Prometheus {path}: {body}")
        return body["data"]

    # --- the end -----------------------------------------------------------------------
    def close(self) -> None:
        if self.service is not None:
            self.service.close()
        for daemon in reversed(self.daemons):
            with contextlib.suppress(Exception):
                daemon.stop()
        self.oncall.close()
        for name in self.settings.nodes:
            node = self.cluster.node(name)
            if node.is_up():
                node.kill_all_but_sshd()


# --- standing it up ---------------------------------------------------------------------


def start_loop(
    cluster: Cluster, sim: JacclSim, model_dir: Path, settings: LoopSettings | None = None
) -> Loop:
    """Every part of the loop, ready: the exporters scraped, the service started (the model
    may still be loading). The caller closes it (or uses it as a context manager)."""
    settings = settings or LoopSettings()
    user = cluster.node_user
    if user is None:
        raise TestbedError("the loop runs in the three-user mode: start_cluster(node_user=...)")
    for name in settings.nodes:  # a fresh boot: empty pools, new boot ids, nothing left
        cluster.reboot(name)
        cluster.node(name).wipe_private_dirs()
    token = uuid.uuid4().hex[:8]
    workdir = cluster.workdir / f"loop-{settings.service}-{token}"
    workdir.mkdir()
    (workdir / "token").write_text(TOKEN + "\n")
    service_dir = workdir / "service"
    service_dir.mkdir()
    os.chown(service_dir, user.uid, user.gid)
    loop = Loop(
        cluster,
        sim,
        settings,
        workdir,
        free_port(),
        workdir / "inventory.yaml",
        workdir / "rendered",
        workdir / "journal.sqlite",
        OncallSink(),
        service_dir,
    )
    try:
        loop.remediator_port, loop.alertmanager_port = free_port(), free_port()
        loop.prometheus_port = free_port()
        program = f"{MODEL}-{token}"
        conf = workdir / f"{program}.conf"  # keep_alive's supervisord config
        _write_inventory(loop, model_dir, program, conf)
        _render(loop)
        for name in settings.nodes:
            cluster.node(name).install_rendered(loop.rendered)
        if settings.before_service is not None:  # before mlx-medic runs anywhere
            settings.before_service(loop)
        for name in settings.nodes:
            loop.daemons.append(_start_exporter(loop, name))
        if settings.remediator:
            loop.daemons.append(_start_remediator(loop))
        loop.daemons.append(_start_alertmanager(loop))
        loop.daemons.append(_start_prometheus(loop))
        _wait(lambda: _targets_up(loop), 90, "every exporter scraped", loop)
        loop.command = _service_command(loop, model_dir)
        loop.program = program
        loop.service = _start_service(loop)
        return loop
    except BaseException:
        loop.close()
        raise


def _start_service(loop: Loop) -> KeepAlive:
    """The model's service: supervisord in the head as KeepAlive, the program as the node
    user, its log and throttle stamp in the user's service dir."""
    user = loop.cluster.node_user
    assert user is not None
    return keep_alive(
        loop.cluster.head,
        loop.command,
        workdir=loop.workdir,
        throttle=loop.settings.throttle,
        env=loop.cluster.env(HF_HUB_OFFLINE="1"),
        name=loop.program,
        user=user.name,
        output_dir=loop.service_dir,
    )


def _write_inventory(loop: Loop, model_dir: Path, program: str, conf: Path) -> None:
    cluster, settings, sim = loop.cluster, loop.settings, loop.sim
    user = cluster.node_user
    assert user is not None
    nodes = list(settings.nodes)
    jaccl = cluster.hostfile(loop.workdir / "jaccl.json", nodes, backend="jaccl")
    ring = cluster.hostfile(loop.workdir / "ring.json", nodes)
    wrapper = settings.service == "serve"
    model: dict[str, Any] = {
        "name": MODEL,
        "model": str(model_dir),
        "nodes": nodes,
        "port": loop.port,
        "service": {
            "manager": "supervisord",
            "label": program,
            "config": str(conf),
            "user": user.name,
            "sudo": True,
            "kind": "wrapper" if wrapper else "script",
        },
        "backends": {
            "jaccl": {"hostfile": str(jaccl)},
            "ring": {"hostfile": str(ring), "pipeline": True},
        },
        "serve_args": {"prefill-step-size": 256},
        "log_files": [str(loop.service_dir / f"{program}.log")],
        "tmp_dirs": [str(cluster.head.cache_mount)],  # what the seed's final fix cleans
        "serve": {
            **sim.serve_settings(),
            "starting_port": 42000 + (os.getpid() % 200) * 20,
            "identity_file": str(user.serve_identity),
            "relaunch_interval": settings.throttle,
        },
        **(
            {
                "process_patterns": {
                    "rank": [p.replace("{port}", str(loop.port)) for p in settings.rank_patterns]
                }
            }
            if settings.rank_patterns
            else {}
        ),
        "policy": {
            "pd_reserve": settings.reserve,
            "kill_grace": "3s",
            "stop_timeout": "40s",
            "start_timeout": "3m",
            "backoff": 0,
            **settings.policy,
        },
    }
    data = yaml.safe_load(cluster.inventory_yaml([model], login_user=user.name))
    data["ssh"].update(
        {"identity_file": str(cluster.remediator_identity), "remediator_addresses": ["127.0.0.1"]}
    )
    for node in data["nodes"].values():
        node.update(
            {
                "medic_command": MEDIC,
                "medic_config": str(loop.inventory),
                "source_addresses": ["127.0.0.1"],
            }
        )
    loop.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def _render(loop: Loop) -> None:
    settings, keys = loop.settings, loop.cluster.workdir / "ssh"
    argv = [
        MEDIC,
        "render",
        "all",
        "--inventory",
        str(loop.inventory),
        "--out",
        str(loop.rendered),
        "--remediator.url",
        f"http://127.0.0.1:{loop.remediator_port}",
        "--alertmanager.address",
        f"127.0.0.1:{loop.alertmanager_port}",
        "--alertmanager.credentials-file",
        str(loop.workdir / "token"),
        "--prometheus.credentials-file",
        str(loop.workdir / "token"),
        "--ssh.public-key",
        str(keys / "remediator_ed25519.pub"),
        "--serve.public-key",
        str(keys / "serve_ed25519.pub"),
        "--prometheus.interval",
        settings.interval,
        "--rules.interval",
        settings.interval,
        "--alertmanager.group-wait",
        settings.group_wait,
        "--alertmanager.group-interval",
        settings.group_interval,
        "--alertmanager.oncall-url",
        loop.oncall.url,
        *[
            arg
            for alert, duration in settings.rules_for.items()
            for arg in ("--rules.for", f"{alert}={duration}")
        ],
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise TestbedError(f"mlx-medic render all: {result.stderr.strip()}")


def _service_command(loop: Loop, model_dir: Path) -> list[str]:
    if loop.settings.service == "serve":
        return [MEDIC, "serve", MODEL, "--inventory", str(loop.inventory)]
    head = loop.cluster.head
    script = write_seed_script(
        loop.workdir / "start.sh",
        loop.settings.service,  # type: ignore[arg-type]
        SeedModel(
            short=MODEL,
            model=model_dir,
            port=loop.port,
            hostfile=loop.workdir / "jaccl.json",
            python=str(loop.sim.python),
            launch=LAUNCH,
            cache=head.cache_mount,
            peers=tuple(loop.settings.nodes[1:]),
            starting_port=42000 + (os.getpid() % 200) * 20,
        ),
    )
    return ["bash", str(script)]


def _start_exporter(loop: Loop, name: str) -> Daemon:
    unit = loop.rendered / "systemd" / name / "mlx-medic-exporter.service"
    log = loop.workdir / f"exporter-{name}.log"
    env = loop.cluster.env(MLX_MEDIC_SERVICE_INTERVAL="0.5")
    return start_exporter(loop.cluster.node(name), unit, log, env)


def unit_command(unit: Path) -> tuple[list[str], dict[str, str]]:
    """A rendered systemd unit's ExecStart argv and its Environment= variables."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            argv = shlex.split(value)
        elif key == "Environment":
            for word in shlex.split(value):
                name, _, setting = word.partition("=")
                env[name] = setting
    if not argv:
        raise TestbedError(f"{unit}: no ExecStart= line")
    return argv, env


def start_exporter(node: SimNode, unit: Path, log: Path, env: dict[str, str]) -> Daemon:
    """The node's exporter with the rendered unit's argv, as root inside the node."""
    argv, unit_env = unit_command(unit)
    with log.open("wb") as out:
        popen = node.spawn(argv, env={**env, **unit_env}, stdout=out, stderr=subprocess.STDOUT)
    pid = node.spawned_pid(popen)
    daemon = Daemon(f"exporter {node.name}", popen, log, pid)
    listen = argv[argv.index("--web.listen-address") + 1]
    host, _, port = listen.rpartition(":")
    _listening(daemon, host, int(port))
    return daemon


def _start_remediator(loop: Loop) -> Daemon:
    config = loop.remediator_config
    token = str(loop.workdir / "token")
    config.write_text(
        yaml.safe_dump(
            {
                "inventory": str(loop.inventory),
                "journal": str(loop.journal),
                # sweep-orphans' clean checks a scrape plus an evaluation apart (both
                # `interval`), and a second's margin
                "orphans_clean_window": f"{2 * parse_duration(loop.settings.interval) + 1:g}s",
                "auth": {
                    "bearer_token_file": token,  # Alertmanager's
                    "basic_username": ONCALL_USER,  # on-call's browser
                    "basic_password_file": token,
                },
            }
        )
    )
    return host_daemon(
        loop.workdir,
        "remediator",
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "remediator",
            "--config.file",
            str(config),
            "--web.listen-address",
            f"127.0.0.1:{loop.remediator_port}",
        ],
        loop.remediator_port,
    )


def _start_alertmanager(loop: Loop) -> Daemon:
    return start_alertmanager(
        loop.workdir, loop.rendered / "alertmanager.yml", loop.alertmanager_port
    )


def start_alertmanager(workdir: Path, config: Path, port: int) -> Daemon:
    """Debian's Alertmanager with `config`, on 127.0.0.1:`port`, its cluster port off."""
    from shutil import which

    binary = which("prometheus-alertmanager") or which("alertmanager")
    if binary is None:
        raise TestbedError("prometheus-alertmanager is not installed (scripts/setup.sh --test)")
    return host_daemon(
        workdir,
        "alertmanager",
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        port,
    )


def _start_prometheus(loop: Loop) -> Daemon:
    from shutil import which

    binary = which("prometheus")
    if binary is None:
        raise TestbedError("prometheus is not installed (scripts/setup.sh --test)")
    daemon = host_daemon(
        loop.workdir,
        "prometheus",
        [
            binary,
            f"--config.file={loop.rendered / 'prometheus.yml'}",
            f"--storage.tsdb.path={loop.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{loop.prometheus_port}",
        ],
        loop.prometheus_port,
    )
    _wait(lambda: _ready(loop.prometheus_port), 60, "Prometheus to be ready", loop, daemon)
    return daemon


def host_daemon(
    workdir: Path, name: str, argv: list[str], port: int, env: dict[str, str] | None = None
) -> Daemon:
    """`argv` started on this machine, its output in `workdir`/NAME.log; returned once it
    listens on 127.0.0.1:`port`."""
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(name, popen, log, popen.pid)
    try:
        _listening(daemon, "127.0.0.1", port)
    except BaseException:
        daemon.stop()
        raise
    return daemon


def _listening(daemon: Daemon, host: str, port: int) -> None:
    """Wait until `daemon` listens; its log's tail in the error if it exits or never does."""

    def alive() -> None:
        if daemon.popen.poll() is not None:
            raise TestbedError(f"{daemon.name} exited {daemon.popen.returncode}:\n{daemon.tail()}")

    try:
        wait_listening(host, port, 60, check=alive)
    except TimeoutError as exc:
        raise TestbedError(f"{exc} ({daemon.name}):\n{daemon.tail()}") from None


def _ready(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/-/ready"
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
        return bool(answer.status == 200)
    return False


def _targets_up(loop: Loop) -> bool:
    with contextlib.suppress(OSError, TestbedError, ValueError):
        targets = loop.prometheus("targets")["activeTargets"]
        exporters = [t for t in targets if t["labels"].get("job") == "mlx-medic-exporter"]
        return len(exporters) == len(loop.settings.nodes) and all(
            t["health"] == "up" for t in exporters
        )
    return False


def _wait(
    predicate: Any, timeout: float, what: str, loop: Loop, daemon: Daemon | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            shown = daemon.tail() if daemon is not None else loop.logs()
            raise TestbedError(f"timed out after {timeout:g}s waiting for {what}:\n{shown}")
        time.sleep(0.2)


__all__ = [
    "Daemon",
    "Loop",
    "LoopSettings",
    "OncallSink",
    "ServiceKind",
    "host_daemon",
    "start_alertmanager",
    "start_exporter",
    "start_loop",
    "unit_command",
]
