"""Every dashboard query returns data from a live scrape.

A real Prometheus scrapes two exporters, each running inside its testbed node, and a real
remediator. What the panels show is made for real first: the seed's orphans (mlx.launch
SIGKILLed while its ranks run on two nodes), stale tmp dirs on both nodes, error lines in
the service logs, a remediation run journaled after Alertmanager's kind of delivery, the
backend pinned to ring on the head. RDMA
exists only on macOS: one exporter reads the macOS fixtures through stand-ins for
`ibv_devinfo` and `ioclasscount` on its PATH (each prints a fixture's verbatim output).
Then each panel's query, with the dashboard variables set to "all", must return series.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from testbed import Cluster, free_port, processes
from testbed.dashboard_queries import VARIABLES, panel_targets
from testbed.dashboard_queries import expand as expand_query
from testbed.launch import start_launch
from testbed.net import wait_listening
from tests.exporter.macos_commands import macos_output
from tests.exporter.test_seed_orphan import RANK_SCRIPT, wait_ready
from tests.node.inventories import helper_inventory
from tests.remediator.conftest import (
    TOKEN,
    Service,
    http,
    make_alert,
    make_payload,
    post_alerts,
    start_service,
    wait_until,
    write_config,
)
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
NODES = ("ai001", "ai002")
# Panel queries that may return nothing here, each with the reason. Empty: every panel
# must show data from the live scrape.
EXCEPTIONS: dict[str, str] = {}
JACCL_LINE = "RuntimeError: [jaccl] Couldn't allocate protection domain"
METAL_LINE = (
    "libc++abi: terminating due to uncaught exception of type std::runtime_error:"
    " [METAL] Command buffer execution failed: Caused GPU Timeout Error"
    " (00000002:kIOGPUCommandBufferCallbackErrorTimeout)"
)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "grafana_generate", REPO / "grafana" / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, query) for every target of every panel."""
    return [
        (name, title, expr)
        for name, board in _generator().dashboards().items()
        for title, expr in panel_targets(board)
    ]


def expand(query: str) -> str:
    query = expand_query(query)
    assert "$" not in query, f"a dashboard variable this test does not set: {query}"
    return query


@dataclass
class Live:
    cluster: Cluster
    workdir: Path
    prometheus_port: int
    logs: dict[str, Path] = field(default_factory=dict)

    def query(self, expr: str) -> list[dict[str, Any]]:
        import urllib.parse

        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        status, body = http("GET", url)
        assert status == 200 and body["status"] == "success", (expr, status, body)
        return list(body["data"]["result"])

    def targets(self) -> dict[str, str]:
        status, body = http("GET", f"http://127.0.0.1:{self.prometheus_port}/api/v1/targets")
        assert status == 200, body
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def tails(self) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {name}:\n" + "\n".join(text.splitlines()[-12:]))
        return "\n".join(parts)


def fake_macos_tools(directory: Path) -> Path:
    """`ibv_devinfo` and `ioclasscount` that print the macOS fixtures' verbatim output."""
    directory.mkdir()
    for tool, fixture in (
        ("ibv_devinfo", "ibv_devinfo_tn3205.txt"),
        ("ioclasscount", "ioclasscount_rdma_reconstructed.txt"),
    ):
        output = directory / f"{tool}.out"
        output.write_text(macos_output(fixture))
        script = directory / tool
        script.write_text(f"#!/bin/sh\nexec cat {output}\n")
        script.chmod(0o755)
    return directory


def make_stale_dir(root: Path, age: float = 7200.0) -> None:
    entry = root / f"tmp{uuid.uuid4().hex[:8]}"
    entry.mkdir(parents=True)
    (entry / "shard.safetensors.part").write_bytes(b"\0" * 65536)
    old = time.time() - age
    for path in (entry / "shard.safetensors.part", entry):
        os.utime(path, (old, old))


def ready(port: int) -> bool:
    """Prometheus answers 200 on /-/ready once its storage is open (refused before)."""
    import urllib.error

    try:
        return http("GET", f"http://127.0.0.1:{port}/-/ready")[0] == 200
    except urllib.error.URLError:
        return False


def wait_for(predicate: Any, what: str, live: Live, timeout: float = 120.0) -> Any:
    try:
        return wait_until(predicate, timeout=timeout, interval=0.5, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{live.tails()}") from None


@pytest.fixture(scope="module")
def live(
    cluster: Cluster, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    prometheus = require_tool("prometheus")
    token = uuid.uuid4().hex[:8]
    workdir = cluster.workdir / f"dashboards-{token}"
    workdir.mkdir()
    started: list[subprocess.Popen[bytes]] = []
    exporters: list[int] = []  # host pids of the exporters inside the nodes
    services: list[Service] = []
    launch = None
    try:
        # One model on ai001 (head) and ai002 with its own dirs, log file and ports.
        script = workdir / "serve.py"
        script.write_text(RANK_SCRIPT)
        port = free_port()
        tmp_inside = cluster.head.cache_mount / f"share-{token}"
        log_inside = cluster.head.log_mount / f"dash-{token}.err.log"
        hostfile = cluster.hostfile(workdir / "ring.json", list(NODES))
        model = {
            "name": "dash",
            "model": str(tiny_model),
            "nodes": list(NODES),
            "port": port,
            "service": {"manager": "supervisord", "label": f"dash-{token}"},
            "backends": {"ring": {"hostfile": str(hostfile), "pipeline": True}},
            "tmp_dirs": [str(tmp_inside)],
            "log_files": [str(log_inside)],
            "process_patterns": {"rank": [rf"serve\.py --model \S+ --port {port}"]},
            "policy": {"restart_budget": 3, "backoff": 0},
        }
        inventory = helper_inventory(cluster, [model], "dashboards")

        # The seed's orphans, for real: ranks on both nodes, then mlx.launch SIGKILLed.
        launch = start_launch(
            cluster,
            hostfile,
            [cluster.python, str(script), "--model", str(tiny_model), "--port", str(port)],
            env=cluster.env(HF_HUB_OFFLINE="1"),
            launch_args=["--starting-port", str(free_port())],
        )
        wait_ready(launch, 2)
        launch.kill()

        # The backend pinned to ring on the head, as the remediator's fallback pins it.
        pin = cluster.head.spawn(
            [
                cluster.python,
                "-m",
                "mlx_medic.cli",
                "node",
                "backend",
                "dash",
                "set",
                "ring",
                "--by",
                "live-dashboards test",
                "--reason",
                "JACCL failed",
                "--inventory",
                str(inventory),
                "--node",
                "ai001",
                "--json",
            ],
            env=cluster.env(PYTHONPATH=str(REPO)),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = pin.communicate(timeout=60)
        assert pin.returncode == 0, err.decode()

        # Stale tmp dirs on both nodes (an interrupted mlx_lm.share: a partial shard).
        for name in NODES:
            make_stale_dir(cluster.node(name).host_path(tmp_inside))

        # An exporter inside each node; ai002's reads the macOS RDMA fixtures.
        fakes = fake_macos_tools(workdir / "macos-tools")
        exporter_port = free_port()
        scrape_targets = []
        live = Live(cluster, workdir, free_port())
        for name in NODES:
            node = cluster.node(name)
            extra_path = f"{fakes}{os.pathsep}" if name == "ai002" else ""
            env = cluster.env(PYTHONPATH=str(REPO), MLX_MEDIC_SERVICE_INTERVAL="0.5")
            env["PATH"] = extra_path + env["PATH"]
            log_path = workdir / f"exporter-{name}.log"
            live.logs[f"exporter {name}"] = log_path
            with log_path.open("wb") as log:
                nsenter = node.spawn(
                    [
                        cluster.python,
                        "-m",
                        "mlx_medic.cli",
                        "exporter",
                        "--inventory",
                        str(inventory),
                        "--node",
                        name,
                        "--web.listen-address",
                        f"{node.address}:{exporter_port}",
                    ],
                    env=env,
                    cwd=str(REPO),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            started.append(nsenter)
            exporters.append(node.spawned_pid(nsenter))
            wait_listening(node.address, exporter_port, timeout=60)
            scrape_targets.append(f"{node.address}:{exporter_port}")

        # Error lines in the service logs, written once the exporters follow them.
        for name in NODES:
            with cluster.node(name).host_path(log_inside).open("a") as service_log:
                service_log.write(f"{JACCL_LINE}\n{METAL_LINE}\n")

        # The remediator, with one run journaled from an Alertmanager-shaped delivery.
        token_file = workdir / "token"
        token_file.write_text(TOKEN + "\n")
        config = write_config(
            workdir / "remediator.yml",
            {
                "inventory": str(inventory),
                "journal": str(workdir / "journal.sqlite"),
                "auth": {"bearer_token_file": str(token_file)},
            },
        )
        remediator = start_service(config, workdir / "journal.sqlite", workdir)
        services.append(remediator)
        live.logs["remediator"] = remediator.stderr_path
        status, body = post_alerts(remediator, make_payload(make_alert("dash")))
        assert status == 202, body

        # Prometheus scraping all three every second.
        prometheus_dir = workdir / "prometheus"
        prometheus_dir.mkdir()
        (prometheus_dir / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "mlx-medic-exporter",
                            "static_configs": [{"targets": scrape_targets}],
                        },
                        {
                            "job_name": "mlx-medic-remediator",
                            "authorization": {"credentials_file": str(token_file)},
                            "static_configs": [{"targets": [f"127.0.0.1:{remediator.port}"]}],
                        },
                    ],
                }
            )
        )
        live.logs["prometheus"] = prometheus_dir / "prometheus.log"
        with live.logs["prometheus"].open("wb") as log:
            started.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={prometheus_dir / 'prometheus.yml'}",
                        f"--storage.tsdb.path={prometheus_dir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{live.prometheus_port}",
                    ],
                    cwd=prometheus_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_for(lambda: ready(live.prometheus_port), "Prometheus to be ready", live)
        wait_for(
            lambda: (t := live.targets()) and len(t) == 3 and set(t.values()) == {"up"},
            "every target scraped",
            live,
        )
        wait_for(
            lambda: [
                r
                for r in live.query("mlx_medic_remediations_total")
                if r["metric"].get("model") == "dash"
            ],
            "the remediation run to be counted",
            live,
        )
        counted = 'mlx_log_errors_total{signature="jaccl_protection_domain"} > 0'
        wait_for(lambda: live.query(counted), "the JACCL error lines to be counted", live)
        time.sleep(5)  # rate() and increase() need a few samples after the last change
        yield live
    finally:
        for pid in exporters:
            processes.kill_quietly(pid, 15)
        for proc in reversed(started):
            processes.kill_quietly(proc.pid, 15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for service in services:
            service.stop()
        if launch is not None:
            launch.close()
        for node in cluster.nodes:
            if node.is_up():
                node.kill_all_but_sshd()
            node.wipe_private_dirs()


PANELS = panel_queries()


@pytest.mark.parametrize(
    ("board", "title", "query"), PANELS, ids=[f"{b}:{t}:{i}" for i, (b, t, _) in enumerate(PANELS)]
)
def test_every_panel_query_returns_data_from_the_live_scrape(
    live: Live, board: str, title: str, query: str
) -> None:
    if query in EXCEPTIONS:
        pytest.skip(EXCEPTIONS[query])  # listed, with its reason
    result = live.query(expand(query))
    assert result, f"{board} panel {title!r} shows nothing: {expand(query)}\n{live.tails()}"


def test_every_listed_exception_is_a_panel_query() -> None:
    queries = {query for _, _, query in panel_queries()}
    assert set(EXCEPTIONS) <= queries, set(EXCEPTIONS) - queries


def test_the_variables_cover_every_dashboard_variable() -> None:
    used = {m for _, _, q in panel_queries() for m in re.findall(r"\$\w+", q)}
    assert used <= set(VARIABLES), used - set(VARIABLES)
