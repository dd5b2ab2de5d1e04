"""Helpers for the remediator's web-side tests: payloads, a recording engine, an
in-process app, and the real service as a subprocess."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition, InvalidAlert
from mlx_medic.remediator.auth import CredentialStore
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import ControlView
from mlx_medic.remediator.webapp import make_app
from mlx_medic.transport import SshTransport
from tests.node.inventories import helper_inventory

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests"
BASIC_USER = "alertmanager"
BASIC_PASSWORD = "basic-pass-for-tests"


# --- payloads -----------------------------------------------------------------


def am_time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def make_alert(
    model: str | None = "m1",
    *,
    alertname: str = "LLMModelDown",
    status: str = "firing",
    fingerprint: str = "0123456789abcdef",
    starts_at: datetime | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    starts = starts_at or datetime.now(UTC) - timedelta(seconds=30)
    all_labels = {"alertname": alertname, "severity": "critical"}
    if model is not None:
        all_labels["model"] = model
    all_labels.update(labels or {})
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": f"model {model} is down"},
        "startsAt": am_time(starts),
        "endsAt": am_time(starts + timedelta(minutes=5))
        if status == "resolved"
        else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph",
        "fingerprint": fingerprint,
    }


def make_payload(*alerts: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    alerts = alerts or (make_alert(),)
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    payload = {
        "version": "4",
        "groupKey": '{}:{alertname="LLMModelDown"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "mlx-medic",
        "groupLabels": {"alertname": "LLMModelDown"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example:9093",
        "alerts": list(alerts),
    }
    payload.update(overrides)
    return payload


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(user: str = BASIC_USER, password: str = BASIC_PASSWORD) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


# --- a recording engine and journal for in-process tests ----------------------


@dataclass
class FakeEngine:
    """Decides like the real engine in the simplest way: one run per model at a time,
    the same firing once. Records every event so tests can check what reached it."""

    known_models: set[str] = field(default_factory=lambda: {"m1", "m2"})
    model_label: str = "model"
    events: list[AlertEvent] = field(default_factory=list)
    started: list[AlertEvent] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    rejected: list[InvalidAlert] = field(default_factory=list)
    problem: str | None = None  # what journal_problem answers
    notes: list[tuple[str, str]] = field(default_factory=list)

    def journal_problem(self) -> str | None:
        return self.problem

    def note(self, kind: str, detail: str) -> None:
        self.notes.append((kind, detail))

    def reject(self, invalid: InvalidAlert) -> Disposition:
        self.rejected.append(invalid)
        return Disposition.INVALID

    async def submit(self, event: AlertEvent) -> Disposition:
        self.events.append(event)
        model = event.labels.get(self.model_label, "")
        if event.status is AlertStatus.RESOLVED:
            return Disposition.RESOLVED
        if event.alertname != "LLMModelDown":
            return Disposition.UNROUTED
        if model not in self.known_models:
            return Disposition.UNKNOWN_MODEL
        if event.dedupe_key in self.seen:
            return Disposition.DUPLICATE
        self.seen.add(event.dedupe_key)
        if model in self.running:
            return Disposition.ABSORBED
        self.running.add(model)
        self.started.append(event)
        return Disposition.STARTED


@dataclass
class FakeRun:
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.data


@dataclass
class FakeJournal:
    runs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    held: list[ControlView] = field(default_factory=list)  # pauses and open circuits

    def list_runs(
        self, model: str | None = None, since: float | None = None, limit: int = 50
    ) -> list[FakeRun]:
        self.queries.append({"model": model, "since": since, "limit": limit})
        selected = [r for r in self.runs if model is None or r.get("model") == model]
        return [FakeRun(r) for r in selected[:limit]]

    def list_events(
        self,
        model: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        limit: int = 100,
    ) -> list[FakeRun]:
        return [FakeRun(e) for e in self.events if kind in (None, e.get("kind"))][:limit]

    def recent_decisions(
        self, model: str | None = None, since: float | None = None, limit: int = 25
    ) -> list[FakeRun]:
        return [FakeRun(e) for e in self.events[:limit]]

    def controls(self) -> list[ControlView]:
        return list(self.held)


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    """Engines made by a test are closed after it, even when it fails."""
    made: list[Engine] = []
    yield made
    for engine in made:
        await engine.close()


@pytest.fixture
async def ssh_transports() -> AsyncIterator[list[SshTransport]]:
    """SSH transports made by a test are closed after it."""
    made: list[SshTransport] = []
    yield made
    for transport in made:
        await transport.close()


@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Path]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    password = tmp_path / "password"
    password.write_text(BASIC_PASSWORD + "\n")
    return {"token": token, "password": password}


@pytest.fixture
def web_config(secrets: dict[str, Path], tmp_path: Path) -> RemediatorConfig:
    return RemediatorConfig.model_validate(
        {
            "inventory": str(tmp_path / "inventory.yaml"),
            "journal": str(tmp_path / "journal.sqlite"),
            "auth": {
                "bearer_token_file": str(secrets["token"]),
                "basic_username": BASIC_USER,
                "basic_password_file": str(secrets["password"]),
            },
            "max_body_bytes": 64 * 1024,
        }
    )


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def fake_journal() -> FakeJournal:
    return FakeJournal()


@pytest.fixture
async def client(
    fake_engine: FakeEngine, fake_journal: FakeJournal, web_config: RemediatorConfig
) -> AsyncIterator[TestClient]:
    """The real app (auth on: bearer and basic) around the fake engine and journal."""
    app = make_app(
        fake_engine,
        fake_journal,
        web_config,
        CollectorRegistry(),
        CredentialStore(web_config.auth),
    )
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


# --- the real service as a subprocess ------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a node nobody answers for -------------------------------------------------

SILENT_PORT = free_port()


def silent_inventory(tmp_path: Path) -> Inventory:
    """One node, m1's head, at an address where nothing listens: every SSH connect is
    refused at once."""
    return parse_inventory(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "ssh": {"connect_timeout": "3s", "known_hosts": str(tmp_path / "known_hosts")},
                "nodes": {"ai001": {"ssh": "127.0.0.1", "port": SILENT_PORT, "user": "medic"}},
                "models": {
                    "m1": {
                        "model": "tiny",
                        "nodes": ["ai001"],
                        "port": free_port(),
                        "service": {"manager": "supervisord", "label": "m1"},
                        "backends": {"ring": {"hostfile": str(tmp_path / "m1.ring.json")}},
                    }
                },
            }
        )
    )


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def mlx_medic(
    *args: str, timeout: float = 60, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI, as on-call runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *args],
        cwd=REPO,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@dataclass
class Service:
    """A running `mlx-medic remediator` subprocess."""

    proc: subprocess.Popen[bytes]
    port: int
    config_file: Path
    stderr_path: Path
    journal: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.stderr_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


# The real entry point, and the same with the test playbooks registered beside the built-ins.
REMEDIATOR = ("mlx_medic.cli", "remediator")
REMEDIATOR_WITH_TEST_PLAYBOOKS = ("tests.remediator.service_with_test_playbooks",)


def start_service(
    config_file: Path,
    journal: Path,
    workdir: Path,
    *extra_args: str,
    env: dict[str, str] | None = None,
    command: tuple[str, ...] = REMEDIATOR,
    wrapper: tuple[str, ...] = (),
) -> Service:
    """`wrapper`: argv that execs the service in the end (its pid stays the service's)."""
    port = free_port()
    stderr_path = workdir / f"remediator-{port}.log"
    module, *subcommand = command
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [
                *wrapper,
                sys.executable,
                "-m",
                module,
                *subcommand,
                "--log.format",
                "json",  # log_lines() reads the JSON lines
                "--config.file",
                str(config_file),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                *extra_args,
            ],
            cwd=workdir,
            env=env or subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    service = Service(proc, port, config_file, stderr_path, journal)
    try:
        wait_for_port(port, proc)
    except Exception:
        service.stop(signal.SIGKILL)
        raise RuntimeError(stderr_path.read_text(errors="replace")[-4000:]) from None
    return service


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """Started services, always stopped at the end (SIGKILL if SIGTERM is ignored)."""
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


# --- a real Alertmanager -----------------------------------------------------------


PEER_TIMEOUT = 2.0  # seconds a clustered Alertmanager waits per position ahead of it


@dataclass
class Alertmanager:
    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def amtool(self, *args: str) -> subprocess.CompletedProcess[str]:
        from tests.tools import require_tool

        return subprocess.run(
            [require_tool("amtool"), *args, f"--alertmanager.url={self.url}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )

    def notified(self) -> int:
        """How many notifications it sent (its debug log's "Notify success" lines)."""
        log = (self.workdir / "alertmanager.log").read_text(errors="replace")
        return log.count('msg="Notify success"')

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def managers() -> Iterator[list[Alertmanager]]:
    """Alertmanagers started by a test, always stopped at the end."""
    started: list[Alertmanager] = []
    yield started
    for manager in started:
        manager.stop()


def alertmanager_config(webhook_url: str | list[str], token_file: Path) -> dict[str, Any]:
    """One webhook receiver whose bearer token comes from a file, with short timings;
    given several URLs (replicas), the receiver notifies each of them."""
    urls = [webhook_url] if isinstance(webhook_url, str) else webhook_url
    return {
        "route": {
            "receiver": "mlx-medic",
            "group_by": ["alertname", "model"],
            "group_wait": "1s",
            "group_interval": "2s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "mlx-medic",
                "webhook_configs": [
                    {
                        "url": url,
                        "send_resolved": True,
                        "http_config": {"authorization": {"credentials_file": str(token_file)}},
                    }
                    for url in urls
                ],
            }
        ],
    }


def start_alertmanager(
    workdir: Path,
    config: dict[str, Any],
    cluster_port: int | None = None,
    peer_ports: tuple[int, ...] = (),
) -> Alertmanager:
    """Alone (its cluster port off), or clustered: gossiping on 127.0.0.1:`cluster_port`
    (listening and advertised there, never on every address) with the peers on
    127.0.0.1:`peer_ports`; a peer that is not first in the cluster waits PEER_TIMEOUT
    (not the default 15 s) for the first one's notification log before it notifies."""
    from tests.tools import require_tool

    if cluster_port is None:
        cluster = ["--cluster.listen-address="]
    else:
        gossip = f"127.0.0.1:{cluster_port}"
        cluster = [
            f"--cluster.listen-address={gossip}",
            f"--cluster.advertise-address={gossip}",
            *(f"--cluster.peer=127.0.0.1:{peer}" for peer in peer_ports),
            f"--cluster.peer-timeout={PEER_TIMEOUT:g}s",
        ]

    binary = require_tool("prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = write_config(workdir / "alertmanager.yml", config)
    port = free_port()
    log = (workdir / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *cluster,
            "--log.level=debug",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    log.close()
    manager = Alertmanager(proc, port, workdir)
    try:
        wait_for_port(port, proc)
    except Exception:
        manager.stop()
        raise RuntimeError((workdir / "alertmanager.log").read_text()[-3000:]) from None
    return manager


def wait_until(
    predicate: Any, timeout: float = 30, interval: float = 0.2, what: str = "condition"
) -> Any:
    """Poll `predicate` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --- the real service on the simulated cluster ---------------------------------------

ROUTING = {"LLMModelDown": "recover", "SlowDown": "slow", "FlapDown": "quick-recovering"}


@dataclass
class Stack:
    """Files for a real `mlx-medic remediator` (with the test playbooks of
    tests.remediator.slow_playbook) whose models live on the testbed's head node: the
    model lock is taken there over SSH, and the re-check probes the models' loopback
    listeners there with `mlx-medic probe` (the remediator runs on no node). Nothing
    listens on the models' ports, so the re-check finds them down."""

    cluster: Any
    workdir: Path
    token_file: Path
    inventory: Path
    journal_path: Path
    started: list[Service]

    def config(self, name: str = "remediator.yml", **settings: Any) -> Path:
        base: dict[str, Any] = {
            "inventory": str(self.inventory),
            "journal": str(self.journal_path),
            "auth": {
                "bearer_token_file": str(self.token_file),
                "basic_username": BASIC_USER,
                "basic_password_file": str(self.workdir / "password"),
            },
            "routing": {"playbooks": ROUTING},
            "max_body_bytes": 64 * 1024,
        }
        base.update(settings)
        return write_config(self.workdir / name, base)

    def start(
        self,
        *args: str,
        config: Path | None = None,
        journal: Path | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> Service:
        """`journal`: the one `config` names, when not the stack's."""
        service = start_service(
            config or self.config(),
            journal or self.journal_path,
            self.workdir,
            *args,
            command=REMEDIATOR_WITH_TEST_PLAYBOOKS,
            wrapper=wrapper,
        )
        self.started.append(service)
        return service

    def journal(self) -> Any:
        from mlx_medic.remediator.journal import Journal

        return Journal(self.journal_path)

    def lock_file(self, model: str) -> Path:
        return self.cluster.head.state_dir / "locks" / f"{model}.lock"


@pytest.fixture
def stack(clean_cluster: Any, tmp_path: Path, services: list[Service]) -> Stack:
    workdir = tmp_path / "stack"
    workdir.mkdir()
    (workdir / "token").write_text(TOKEN + "\n")
    (workdir / "password").write_text(BASIC_PASSWORD + "\n")
    policy = {"restart_budget": 2, "window": "1h", "backoff": 0}
    models = [
        {
            "name": name,
            "model": "tiny",
            "nodes": ["ai001"],
            "port": free_port(),
            "service": {"manager": "supervisord", "label": f"mlx-{name}"},
            "backends": {"ring": {"hostfile": str(workdir / f"{name}.ring.json")}},
            "policy": policy,
        }
        for name in ("m1", "m2")
    ]
    # sshd's PATH is minimal: every node runs this venv's mlx-medic (the re-check's probe,
    # the lock's helpers) with this inventory, written where every node can read it
    inventory = helper_inventory(clean_cluster, models, "stack")
    return Stack(
        clean_cluster, workdir, workdir / "token", inventory, workdir / "journal.sqlite", services
    )


def http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
) -> tuple[int, Any]:
    """(status, decoded JSON or text) without raising on 4xx/5xx."""
    import urllib.error
    import urllib.request

    data = None
    all_headers = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
            kind = response.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get_content_type()
    text = raw.decode("utf-8", "replace")
    return status, json.loads(text) if kind == "application/json" else text


def post_alerts(
    service: Service, payload: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    return http("POST", service.url + "/alerts", payload, bearer() if headers is None else headers)


def runs_of(stack: Stack | Path, model: str) -> list[dict[str, Any]]:
    """The model's runs in the stack's journal, or in the journal at that path."""
    from mlx_medic.remediator.journal import Journal

    journal = stack.journal() if isinstance(stack, Stack) else Journal(stack)
    try:
        return [r.to_dict() for r in journal.list_runs(model=model, limit=500)]
    finally:
        journal.close()


def events_of(stack: Stack, **filters: Any) -> list[dict[str, Any]]:
    journal = stack.journal()
    try:
        return [e.to_dict() for e in journal.list_events(limit=1000, **filters)]
    finally:
        journal.close()
