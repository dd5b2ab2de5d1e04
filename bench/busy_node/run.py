#!/usr/bin/env python3
"""A busy node: the whole exporter, with a 50-model inventory, on 8,000 processes.

In one run, on one process table:

- a pids cgroup of its own (`/sys/fs/cgroup/pids/mlx-medic-bench-<token>`, cgroup v1,
  `pids.max` capped at what it means to start), created here and removed at the end; every
  process the bench starts for the table is started inside it and ended by its pid;
- one stub rank per model (`python -S -m mlx_lm server --model bench/model-NN --port P`,
  `MLX_RANK=0`; the `mlx_lm` it imports only sleeps), and unrelated `sleep`s until the
  table holds `--processes` processes;
- an inventory of `--models` models, all on node ai001 (this host), each probed on its
  port (nothing listens: the models read as down);
- ours: `mlx-medic exporter --inventory ... --node ai001`, every default collector;
  Debian's `prometheus-process-exporter` with its defaults, grouping the ranks by their
  `--model` (bench/process_scrape's config); Debian's `prometheus-node-exporter` with its
  defaults (the memory peer, as in bench/exporter_memory).

After a warm-up, each exporter is scraped `--scrapes` times back to back over HTTP: CPU
per scrape is the growth of its utime + stime over the scrapes (all threads, its
background probes included), divided by the scrapes. Then resident memory (RSS, USS, PSS)
of ours and node_exporter, and the series ours serves per model. As root, on Linux:

    python3 bench/busy_node/run.py [--processes 8000] [--models 50] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from exporter_memory.run import loaded_markers  # noqa: E402
from process_scrape.run import (  # noqa: E402
    REPO,
    Population,
    free_port,
    measure,
    process_count,
    process_exporter_config,
    scrape,
    wait_up,
    warm,
)

PIDS_ROOT = Path("/sys/fs/cgroup/pids")
MIB = 1024 * 1024
NODE = "ai001"
FIRST_PORT = 21000


class PidsGroup:
    """A pids cgroup this bench makes, caps, and removes once every pid in it has ended."""

    def __init__(self, token: str, cap: int) -> None:
        if not (PIDS_ROOT / "cgroup.procs").exists():
            raise SystemExit(f"{PIDS_ROOT}: no cgroup v1 pids controller mounted here")
        self.path = PIDS_ROOT / f"mlx-medic-bench-{token}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(f"{cap}\n")

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This process inside the group while the block runs: what it starts stays there."""
        home = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.split(":")[1] == "pids"
        )
        (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            yield
        finally:
            (PIDS_ROOT / home.lstrip("/") / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def pids(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        """Every pid left in the group is one this bench started: end it, then rmdir."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.path.rmdir()


def model_name(index: int) -> str:
    return f"m{index:02d}"


def write_inventory(
    workdir: Path, nodes: dict[str, str], models: dict[str, tuple[list[str], int]]
) -> Path:
    """A valid inventory of `nodes` (name: address; root logs in) and `models` (name: its
    nodes, its port), each model `bench/NAME` with a supervisord service and a ring
    hostfile that need not exist (the exporter only reads their names)."""
    lines = [
        f"state_dir: {workdir / 'state'}",
        "ssh: {allow_root_login: true}",
        "nodes:",
        *(f"  {name}: {{ssh: {address}, user: root}}" for name, address in nodes.items()),
        "models:",
    ]
    for name, (members, port) in models.items():
        lines.append(
            f"  {name}: {{model: bench/{name}, nodes: [{', '.join(members)}], port: {port},"
            f" service: {{manager: supervisord, label: {name}}},"
            f" backends: {{ring: {{hostfile: {workdir}/{name}.json}}}}}}"
        )
    path = workdir / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def our_exporter(inventory: Path, node: str, *more: str) -> list[str]:
    """`mlx-medic exporter` of this tree, as node `node` of `inventory`, then `more`."""
    medic = [sys.executable, "-m", "mlx_medic.cli", "exporter"]
    return [*medic, "--inventory", str(inventory), "--node", node, *more]


def commands(workdir: Path, inventory: Path) -> dict[str, list[str]]:
    """Each exporter's argv, but for its listen address."""
    config = process_exporter_config(workdir)
    process_exporter = shutil.which("prometheus-process-exporter")
    if process_exporter is None:
        raise SystemExit("prometheus-process-exporter is not installed (its Debian package)")
    node_exporter = shutil.which("prometheus-node-exporter")
    if node_exporter is None:
        raise SystemExit(
            "prometheus-node-exporter is not installed (its Debian package): it is the memory"
            " peer, measured in the same run"
        )
    argvs = {
        "mlx-medic exporter": our_exporter(inventory, NODE, "--web.listen-address"),
        "process-exporter (defaults)": [
            process_exporter,
            "-config.path",
            str(config),
            "-web.listen-address",
        ],
        "node_exporter (defaults)": [node_exporter, "--web.listen-address"],
    }
    return argvs


@contextlib.contextmanager
def exporters(argvs: dict[str, list[str]]) -> Iterator[dict[str, tuple[int, int]]]:
    """{name: (pid, port)}; each started here and ended by its pid."""
    started: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, argv in argvs.items():
            port = free_port()
            child = subprocess.Popen(
                [*argv, f"127.0.0.1:{port}"],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            started[name] = (child, port)
        for _child, port in started.values():
            wait_up(port)
        yield {name: (child.pid, port) for name, (child, port) in started.items()}
    finally:
        for child, _port in started.values():
            child.terminate()
        for child, _port in started.values():
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def series_per_model(body: bytes, models: int) -> tuple[int, float]:
    """(series in the scrape, series carrying a model label, per model)."""
    samples = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    with_model = sum(1 for line in samples if 'model="m' in line)
    return len(samples), with_model / models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8000, help="processes on the table")
    parser.add_argument("--models", type=int, default=50, help="models in the inventory")
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes per measurement")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    token = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"mlx-medic-bench-{token}-", dir="/var/tmp"))
    inventory = write_inventory(
        workdir,
        {NODE: "127.0.0.1"},
        {model_name(i): ([NODE], FIRST_PORT + i) for i in range(args.models)},
    )
    population = Population(workdir, token)
    group = PidsGroup(token, cap=args.processes + 100)
    try:
        with group.joined():
            for index in range(args.models):
                population.start_rank(f"bench/{model_name(index)}", FIRST_PORT + index, 0)
            population.grow_unrelated_to(max(0, args.processes - process_count() - 3))
        with exporters(commands(workdir, inventory)) as handles:
            warm(handles, 6.0)
            table = process_count()
            cpu = {
                name: measure(pid, port, args.scrapes)[0] for name, (pid, port) in handles.items()
            }
            memory = {
                name: psutil.Process(pid).memory_full_info()
                for name, (pid, _port) in handles.items()
                if not name.startswith("process-exporter")
            }
            loaded = loaded_markers(handles["mlx-medic exporter"][0])
            series, per_model = series_per_model(
                scrape(handles["mlx-medic exporter"][1]), args.models
            )
            in_group = len(group.pids())
    finally:
        population.close()
        group.remove()
        shutil.rmtree(workdir, ignore_errors=True)

    ours, theirs = cpu["mlx-medic exporter"], cpu["process-exporter (defaults)"]
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average"
        f" {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"{table} processes on the table ({in_group} in the bench's pids cgroup, capped at "
        f"{args.processes + 100}); {args.models} models in the inventory; "
        f"{args.scrapes} scrapes each\n"
    )
    print("| exporter | CPU ms / scrape | ours / theirs |")
    print("|---|---:|---:|")
    for name, seconds in cpu.items():
        ratio = f"**{ours / seconds:.3f}**" if name.startswith("process") and seconds else ""
        print(f"| {name} | {seconds * 1000:.2f} | {ratio} |")
    base = memory["node_exporter (defaults)"]
    print("\n| exporter | RSS MiB | USS MiB | PSS MiB | RSS ratio | loaded |")
    print("|---|---:|---:|---:|---:|---|")
    for name, info in memory.items():
        shown = ", ".join(loaded) if name.startswith("mlx") else "(Go)"
        print(
            f"| {name} | {info.rss / MIB:.1f} | {info.uss / MIB:.1f} | {info.pss / MIB:.1f} |"
            f" {info.rss / base.rss:.2f} | {shown} |"
        )
    ours_rss = memory["mlx-medic exporter"].rss
    print(
        f"\nours serves {series} series; {per_model:.1f} per model "
        f"(series with a model label / {args.models}); ours/theirs CPU {ours / theirs:.3f};"
        f" ours/node_exporter RSS {ours_rss / base.rss:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
