#!/usr/bin/env python3
"""The exporter's resident memory beside Debian's prometheus-node-exporter, in one run.

Starts each of these on 127.0.0.1 (a free port), one after another, in every round:

- `node_exporter`: Debian's `prometheus-node-exporter` (or `--node-exporter PATH`) with
  its defaults;
- `ours (defaults)`: `mlx-medic exporter` with the embedded defaults (no inventory:
  MLX processes discovered by command line, every default collector);
- `ours (inventory)`: `mlx-medic exporter --inventory examples/inventory.yaml --node
  ai001` (the head of glm-4_6-5b: the service collector probes 127.0.0.1:8080 every 30 s;
  the example's tmp dirs and logs do not exist on a Linux host, so they read as missing),
  with its state in a temp dir.

Each is scraped `--scrapes` times over HTTP (`--gap` seconds apart), then measured with
psutil: RSS, USS (pages only this process maps) and PSS (shared pages split among their
users), and the peak RSS (`VmHWM`). Medians over `--rounds` rounds and their ratios to
node_exporter are printed as a Markdown table, with the large shared objects our
exporter has mapped (which packages it loaded). Every process is stopped by its pid.

    python3 bench/exporter_memory/run.py [--rounds 3] [--scrapes 20]

Fails with a clear message when the node_exporter binary is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "examples" / "inventory.yaml"
NODE_EXPORTER = "prometheus-node-exporter"
MIB = 1024 * 1024
# Shared objects that tell which heavy packages a process has loaded.
MARKERS = {
    "_pydantic_core": "pydantic",
    "_yaml": "yaml (C)",
    "_hs_ext": "hyperscan",
    "_psutil_linux": "psutil",
    "_asyncio": "asyncio",
    "_ssl": "ssl",
}


@dataclass(frozen=True)
class Reading:
    rss: float
    uss: float
    pss: float
    peak: float
    loaded: tuple[str, ...]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        if response.status != 200 or not body:
            raise RuntimeError(f"{url} answered {response.status} with {len(body)} bytes")
        return body


def wait_serving(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before serving")
        try:
            scrape(url, timeout=5)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing served {url} within {timeout:.0f}s") from None
            time.sleep(0.2)


def peak_rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / MIB
    return float("nan")


def loaded_markers(pid: int) -> tuple[str, ...]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return tuple(name for marker, name in MARKERS.items() if marker in maps)


@contextlib.contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def measure(argv: list[str], port: int, scrapes: int, gap: float) -> Reading:
    url = f"http://127.0.0.1:{port}/metrics"
    with started(argv) as proc:
        wait_serving(url, proc)
        for _ in range(scrapes):
            scrape(url)
            time.sleep(gap)
        info = psutil.Process(proc.pid).memory_full_info()
        return Reading(
            info.rss / MIB,
            info.uss / MIB,
            info.pss / MIB,
            peak_rss(proc.pid),
            loaded_markers(proc.pid),
        )


def contenders(node_exporter: str, state_dir: Path) -> dict[str, list[str]]:
    ours = [sys.executable, "-m", "mlx_medic.cli", "exporter"]
    return {
        "node_exporter": [node_exporter],
        "ours (defaults)": ours,
        "ours (inventory)": [
            *ours,
            "--inventory",
            str(INVENTORY),
            "--node",
            "ai001",
            "--state-dir",
            str(state_dir),
        ],
    }


def listen_flag(name: str, port: int) -> list[str]:
    flag = "--web.listen-address"
    return [f"{flag}=127.0.0.1:{port}"] if name == "node_exporter" else [flag, f"127.0.0.1:{port}"]


def version_of(binary: str) -> str:
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    said = (result.stdout + result.stderr).strip().splitlines()
    return said[0] if said else "unknown version"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--node-exporter",
        default=NODE_EXPORTER,
        help=f"the node_exporter binary (default {NODE_EXPORTER}, on PATH)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes before measuring")
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between scrapes")
    args = parser.parse_args()

    node_exporter = shutil.which(args.node_exporter)
    if node_exporter is None:
        print(
            f"{args.node_exporter} is not installed (not on PATH): install Debian's "
            "prometheus-node-exporter (apt-get install prometheus-node-exporter) or pass "
            "--node-exporter PATH",
            file=sys.stderr,
        )
        return 2

    readings: dict[str, list[Reading]] = {}
    with tempfile.TemporaryDirectory(prefix="mlx-medic-bench-memory-") as state:
        for _ in range(args.rounds):
            for name, argv in contenders(node_exporter, Path(state)).items():
                port = free_port()
                reading = measure([*argv, *listen_flag(name, port)], port, args.scrapes, args.gap)
                readings.setdefault(name, []).append(reading)

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )
    print(
        f"node_exporter: {node_exporter} ({version_of(node_exporter)}); prometheus-client "
        f"{importlib.metadata.version('prometheus-client')}; psutil {psutil.__version__}"
    )
    print(
        f"rounds {args.rounds}, {args.scrapes} scrapes {args.gap:g} s apart before measuring;"
        " medians in MiB\n"
    )
    base = {
        field: statistics.median(getattr(r, field) for r in readings["node_exporter"])
        for field in ("rss", "uss", "pss", "peak")
    }
    print("| exporter | RSS | USS | PSS | peak RSS | RSS ratio | USS ratio | PSS ratio | loaded |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, taken in readings.items():
        median = {
            field: statistics.median(getattr(r, field) for r in taken)
            for field in ("rss", "uss", "pss", "peak")
        }
        loaded = ", ".join(taken[-1].loaded) if name != "node_exporter" else "(Go)"
        print(
            f"| {name} | {median['rss']:.1f} | {median['uss']:.1f} | {median['pss']:.1f} | "
            f"{median['peak']:.1f} | {median['rss'] / base['rss']:.2f} | "
            f"{median['uss'] / base['uss']:.2f} | {median['pss'] / base['pss']:.2f} | "
            f"{loaded} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
