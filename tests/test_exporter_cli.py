"""`mlx-medic exporter` with the embedded defaults: no inventory, MLX processes
discovered by command line, every collector reported."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from mlx_medic.node_identity import write_node_id
from testbed import free_port, wait_listening


def test_without_an_inventory_it_says_it_discovers_and_scrapes_every_collector() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "exporter", "--once"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no inventory: discovering MLX processes by command line" in result.stderr
    for collector in ("logs", "memory", "processes", "rdma", "service", "tmpdirs"):
        assert f'mlx_medic_collector_success{{collector="{collector}"}} 1.0' in result.stdout


def test_it_serves_a_landing_page_and_metrics_over_http() -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlx_medic.cli", "exporter",
         "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening("127.0.0.1", port, 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert b'<a href="/metrics">' in page.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as metrics:
            assert b"mlx_medic_collector_duration_seconds" in metrics.read()
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
        [sys.executable, "-m", "mlx_medic.cli", "exporter", "--config.file", str(inventory),
         "--state-dir", str(tmp_path / "state"), "--once", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


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
