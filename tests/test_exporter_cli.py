"""`mlx-medic exporter` with the embedded defaults: no inventory, MLX processes
discovered by command line, every collector reported."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

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
