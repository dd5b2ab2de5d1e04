"""`mlx-medic exporter`: with the embedded defaults (no inventory, MLX processes discovered
by command line) every collector is reported and no series claims a node; over HTTP,
/metrics answers as client_python's handler does (OpenMetrics by Accept, gzip, `name[]`) beside a
landing page that says which node and which collector settings."""

from __future__ import annotations

import gzip
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from mlx_medic.state.node_identity import write_node_id
from testbed import free_port, wait_listening
from tests.test_metric_contract import inventory_text
from tests.tools import require_tool


def test_without_an_inventory_it_says_it_discovers_and_scrapes_every_collector() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "exporter", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "no inventory: discovering MLX processes by command line" in result.stderr
    assert "series carry no node label" in result.stderr
    for collector in ("logs", "memory", "processes", "rdma", "service", "tmpdirs"):
        assert f'mlx_medic_collector_success{{collector="{collector}"}} 1.0' in result.stdout
    assert 'node="' not in result.stdout  # identity is never guessed


def help_lines(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "exporter", "--once", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("# HELP")]


def test_help_texts_are_the_same_whatever_the_collector_settings() -> None:
    """HELP is constant per metric: settings are on the landing page, never in HELP."""
    changed = help_lines(
        "--collector.service.interval",
        "5",
        "--collector.service.timeout",
        "2",
        "--collector.tmpdirs.interval",
        "7",
        "--collector.logs.max-read-per-scrape",
        "9",
    )
    assert changed and changed == help_lines()


HEAVY = ("pydantic", "yaml", "asyncio", "aiohttp", "asyncssh", "hyperscan")


def heavy_modules_after_one_scrape(*argv: str) -> set[str]:
    """Which memory-heavy packages `mlx-medic exporter --once ARGV` loaded."""
    code = (
        "import sys\n"
        "from mlx_medic.cli import main\n"
        f"code = main(['exporter', '--once', *{list(argv)!r}])\n"
        f"print('LOADED', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("LOADED"))
    return set(line.split()[1:])


def test_without_an_inventory_the_exporter_loads_no_schema_event_loop_or_regex_engine() -> None:
    """Memory: Hyperscan comes with log bytes to scan; pydantic, YAML, asyncio, aiohttp
    and asyncssh never (bench/exporter_memory, bench/busy_node)."""
    assert heavy_modules_after_one_scrape() == set()


def test_with_an_inventory_the_exporter_loads_no_schema_or_event_loop(tmp_path: Path) -> None:
    """The inventory is validated by a child process (or read from its snapshot)."""
    config = tmp_path / "inventory.yaml"
    config.write_text(inventory_text(tmp_path))
    for _first_then_from_the_snapshot in range(2):
        loaded = heavy_modules_after_one_scrape("--inventory", str(config), "--node", "n1")
        assert not {"pydantic", "yaml", "asyncio", "aiohttp", "asyncssh"} & loaded


class Exporter:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **headers: str) -> tuple[dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(response.headers), response.read()


def serve(*argv: str) -> Iterator[Exporter]:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            *argv,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening("127.0.0.1", port, 60)
        yield Exporter(port)
    finally:
        server.kill()
        server.wait(timeout=10)


# --- which node it is: said (--node or <state dir>/node-id), never guessed --------------

INVENTORY = """\
nodes:
  ai001: {ssh: 127.0.0.1}
  ai002: {ssh: 127.0.0.2}
models:
  peer-only:
    model: /models/tiny
    nodes: [ai002]
    port: 18099
    service: {manager: supervisord, label: peer-only}
    backends: {ring: {hostfile: /etc/ring.json}}
"""


def exporter_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--inventory",
            str(inventory),
            "--state-dir",
            str(tmp_path / "state"),
            "--once",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_with_an_inventory_and_no_node_name_it_exits_2_and_says_both_ways_to_name_it(
    tmp_path: Path,
) -> None:
    # ai001's address is this machine's own 127.0.0.1; an address is no identity.
    result = exporter_once(tmp_path)
    assert result.returncode == 2
    assert "which inventory node is this? pass --node NAME or write it to" in result.stderr
    assert str(tmp_path / "state" / "node-id") in result.stderr
    assert "# HELP" not in result.stdout


def test_the_node_id_file_in_the_state_dir_names_the_node(tmp_path: Path) -> None:
    write_node_id(tmp_path / "state", "ai002")
    result = exporter_once(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "node ai002;" in result.stderr
    assert "watching model peer-only" in result.stderr  # ai002's models, not ai001's


def test_a_node_id_file_naming_a_node_the_inventory_lacks_is_refused(tmp_path: Path) -> None:
    write_node_id(tmp_path / "state", "ai009")
    result = exporter_once(tmp_path)
    assert result.returncode == 2
    assert "names 'ai009', which is not in the inventory (nodes: ai001, ai002)" in result.stderr


def test_node_beats_the_node_id_file(tmp_path: Path) -> None:
    write_node_id(tmp_path / "state", "ai002")
    result = exporter_once(tmp_path, "--node", "ai001")
    assert result.returncode == 0, result.stderr
    assert "node ai001;" in result.stderr and "watching model" not in result.stderr


@pytest.fixture(scope="module")
def discovering() -> Iterator[Exporter]:
    yield from serve("--collector.tmpdirs.interval", "300")


@pytest.fixture
def with_inventory(tmp_path: Path) -> Iterator[Exporter]:
    config = tmp_path / "inventory.yaml"
    config.write_text(inventory_text(tmp_path))
    yield from serve("--inventory", str(config), "--node", "n1")


def test_it_serves_a_landing_page_with_the_node_and_the_collector_settings(
    discovering: Exporter,
) -> None:
    _, page = discovering.get("/")
    assert b'<a href="/metrics">' in page
    assert b"no inventory" in page and b"no <code>node</code> label" in page
    assert b"tmpdirs: interval=300" in page
    assert b"service: interval=30, timeout=10" in page


def test_plain_text_is_the_default_format(discovering: Exporter) -> None:
    headers, body = discovering.get("/metrics")
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"mlx_medic_collector_duration_seconds" in body


def test_openmetrics_is_served_to_who_asks_for_it(discovering: Exporter) -> None:
    headers, body = discovering.get(
        "/metrics", Accept="application/openmetrics-text; version=1.0.0"
    )
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "mlx_medic_collector_success" in names


def test_gzip_is_served_to_who_accepts_it(discovering: Exporter) -> None:
    headers, body = discovering.get("/metrics", **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"mlx_medic_collector_success" in gzip.decompress(body)


def test_name_filters_the_families_served(discovering: Exporter) -> None:
    _, body = discovering.get("/metrics?name[]=mlx_medic_collector_success")
    types = [line for line in body.decode().splitlines() if line.startswith("# TYPE")]
    assert types == ["# TYPE mlx_medic_collector_success gauge"]


def test_other_paths_are_not_found(discovering: Exporter) -> None:
    with pytest.raises(urllib.error.HTTPError) as error:
        discovering.get("/metricz")
    assert error.value.code == 404


def test_with_an_inventory_every_series_served_names_the_node_and_promtool_accepts_it(
    with_inventory: Exporter,
) -> None:
    _, body = with_inventory.get("/metrics")
    samples = [line for line in body.decode().splitlines() if not line.startswith("#")]
    assert samples and all('node="n1"' in line for line in samples), samples
    _, page = with_inventory.get("/")
    assert b"<b>n1</b>" in page
    check = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
