#!/usr/bin/env python3
"""Scrape cost of the `processes` collector against Debian's prometheus-process-exporter.

Both exporters watch the same real process table: 200 rank-like processes
(`python -S -m mlx_lm server --model <dir> --port <p>` with MLX_RANK set; the
`mlx_lm` they run is a stub in a temp dir that only sleeps) among unrelated
`sleep` processes. process-exporter is configured to group exactly those ranks
by their --model (a cmdline matcher). CPU per scrape is the growth of each
exporter's utime+stime (/proc/<pid>/stat) over N scrapes over HTTP, divided by
N. Then the unrelated processes grow and the measurement repeats.

    python3 bench/process_scrape/run.py [--scrapes 200] [--sizes 2000,4000]

Every process this script starts is ended by its pid when it finishes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
RANKS = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        return response.read()


def wait_up(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            scrape(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Population:
    """The processes under observation; all are ended by pid in close()."""

    def __init__(self, workdir: Path, token: str):
        self.workdir = workdir
        self.token = token
        self.model_dir = workdir / f"model-{token}"
        self.model_dir.mkdir()
        stub = workdir / "mlx_lm"
        stub.mkdir()
        (stub / "__init__.py").write_text("")
        (stub / "__main__.py").write_text("import time\ntime.sleep(100000)\n")
        self.ranks: list[subprocess.Popen] = []
        self.unrelated: list[subprocess.Popen] = []

    def start_ranks(self, count: int) -> None:
        for index in range(count):
            self.start_rank(str(self.model_dir), 20000 + index, index)

    def start_rank(self, model: str, port: int, rank: int) -> None:
        """One stub `mlx_lm server --model MODEL --port PORT` with MLX_RANK=rank."""
        argv = [sys.executable, "-S", "-m", "mlx_lm", "server", "--model", model]
        self.ranks.append(
            subprocess.Popen(
                [*argv, "--port", str(port)],
                cwd=self.workdir,
                env={"MLX_RANK": str(rank), "PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def grow_unrelated_to(self, count: int) -> None:
        while len(self.unrelated) < count:
            self.unrelated.append(
                subprocess.Popen(
                    [f"bench-unrelated-{self.token}", "100000"],
                    executable="/bin/sleep",
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def close(self) -> None:
        children = self.ranks + self.unrelated
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        for child in children:
            child.wait()


def other_collectors() -> list[str]:
    sys.path.insert(0, str(REPO))
    from mlx_medic.exporter import collectors  # noqa: F401  (registers them)
    from mlx_medic.exporter.collector import REGISTRY

    return sorted(name for name in REGISTRY if name != "processes")


def process_exporter_config(workdir: Path) -> Path:
    """process-exporter's config: one group per `--model` of the stub ranks."""
    config = workdir / "process-exporter.yml"
    config.write_text(
        "process_names:\n"
        '  - name: "{{.Matches.model}}"\n'
        "    cmdline:\n"
        "    - '-m mlx_lm server --model (?P<model>\\S+)'\n"
    )
    return config


@contextlib.contextmanager
def exporters(workdir: Path, token: str) -> Iterator[dict[str, tuple[int, int]]]:
    """{name: (pid, port)} for ours and process-exporter (defaults and lean flags)."""
    config = process_exporter_config(workdir)
    started: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    binary = shutil.which("prometheus-process-exporter")
    if binary is None:
        raise SystemExit("prometheus-process-exporter is not installed (apt-get install it)")
    commands = {
        "mlx-medic processes": [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--state-dir",
            str(workdir / "state"),
            *[f"--no-collector.{name}" for name in other_collectors()],
        ],
        "process-exporter (defaults)": [binary, "-config.path", str(config)],
        "process-exporter -threads=false -gather-smaps=false": [
            binary,
            "-config.path",
            str(config),
            "-threads=false",
            "-gather-smaps=false",
        ],
    }
    try:
        for name, argv in commands.items():
            port = free_port()
            flag = "--web.listen-address" if name.startswith("mlx") else "-web.listen-address"
            started[name] = subprocess.Popen(
                [*argv, flag, f"127.0.0.1:{port}"],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            ports[name] = port
        for port in ports.values():
            wait_up(port)
        yield {name: (started[name].pid, ports[name]) for name in started}
    finally:
        for child in started.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        for child in started.values():
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()


def measure(pid: int, port: int, scrapes: int) -> tuple[float, float]:
    """(CPU seconds per scrape, wall seconds per scrape), back to back."""
    cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(scrapes):
        scrape(port)
    return (cpu_seconds(pid) - cpu0) / scrapes, (time.perf_counter() - wall0) / scrapes


def warm(handles: dict[str, tuple[int, int]], seconds: float) -> None:
    """Let every exporter see every process, past our 1 s and 5 s rechecks."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _pid, port in handles.values():
            scrape(port)
        time.sleep(0.5)


def process_count() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per measurement")
    parser.add_argument(
        "--sizes",
        default="2000,4000",
        help="total processes on the table to measure at (comma-separated)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    token = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"mlx-medic-bench-{token}-", dir="/var/tmp"))
    population = Population(workdir, token)
    rows = []
    try:
        population.start_ranks(RANKS)
        baseline = process_count()
        with exporters(workdir, token) as handles:
            for size in sizes:
                population.grow_unrelated_to(max(0, size - baseline))
                warm(handles, 6.0)
                table = process_count()
                for name, (pid, port) in handles.items():
                    per_scrape, wall = measure(pid, port, args.scrapes)
                    rows.append((table, name, per_scrape, wall))
                    print(
                        f"{table:>6} processes  {name:<55} {per_scrape * 1000:8.2f} ms CPU"
                        f"  {wall * 1000:8.2f} ms wall per scrape",
                        flush=True,
                    )
    finally:
        population.close()
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {RANKS} scoped ranks; {args.scrapes} scrapes each"
    )
    print()
    print("| processes | exporter | CPU ms/scrape | wall ms/scrape | ours / theirs |")
    print("|---:|---|---:|---:|---:|")
    for table in sorted({r[0] for r in rows}):
        ours = next(r[2] for r in rows if r[0] == table and r[1].startswith("mlx"))
        for _t, name, cpu, wall in (r for r in rows if r[0] == table):
            ratio = "" if name.startswith("mlx") else f"{ours / cpu:.3f}" if cpu else "n/a"
            print(f"| {table} | {name} | {cpu * 1000:.2f} | {wall * 1000:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
