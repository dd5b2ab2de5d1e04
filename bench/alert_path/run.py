#!/usr/bin/env python3
"""The alert path under a fleet: Debian's Prometheus evaluating mlx-medic's rules over
24 exporters every 15 s, with the config and rules `mlx-medic render` writes.

In one run: an inventory of `--nodes` nodes (ai001.., each on its own loopback address
127.0.9.N) and `--models` models of three nodes each; `mlx-medic render prometheus` and
`render rules` from it (15 s scrape and evaluation intervals, the defaults); one
`mlx-medic exporter --inventory ... --node NAME` per node on 127.0.9.N:10900 (the
rendered target); Prometheus on 127.0.9.200. After `--minutes` minutes it reads from
Prometheus: the rule groups' last evaluation time and their median over the run, the
head series, the samples each scrape of an exporter returned, the scrape durations, the
alerts firing; Prometheus's CPU (over the measured minutes) and resident memory; the
exporters' CPU per scrape. Every process is started here and ended by its pid; no
Alertmanager or remediator runs (their addresses answer nothing). Prometheus also scrapes
itself (a job the bench adds to the rendered config), for its rule-evaluation metrics.

    python3 bench/alert_path/run.py [--nodes 24] [--models 8] [--minutes 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from busy_node import run as busy_node  # noqa: E402
from process_scrape.run import REPO, cpu_seconds  # noqa: E402

EXPORTER_PORT = 10900  # the rendered target's port
PROMETHEUS = "127.0.9.200"
PER_MODEL = 3


def address(index: int) -> str:
    return f"127.0.9.{index}"


def write_inventory(workdir: Path, nodes: int, models: int) -> Path:
    if models * PER_MODEL > nodes:
        raise SystemExit(f"{models} models of {PER_MODEL} nodes need {models * PER_MODEL} nodes")
    names = [f"ai{i:03d}" for i in range(1, nodes + 1)]
    return busy_node.write_inventory(
        workdir,
        {name: address(i) for i, name in enumerate(names, start=1)},
        {f"m{m}": (names[PER_MODEL * m : PER_MODEL * (m + 1)], 21100 + m) for m in range(models)},
    )


def render(workdir: Path, inventory: Path) -> Path:
    """prometheus.yml and rules/ as `mlx-medic render` writes them, in `workdir`/rendered."""
    out = workdir / "rendered"
    token = workdir / "prometheus.token"
    token.write_text("unused\n")
    medic = [sys.executable, "-m", "mlx_medic.cli", "render"]
    flags = ["--inventory", str(inventory), "--out", str(out)]
    for target, more in (
        (
            "prometheus",
            [
                "--remediator.url",
                "http://127.0.9.201:10901",
                "--alertmanager.address",
                "127.0.9.202:9093",
                "--prometheus.credentials-file",
                str(token),
            ],
        ),
        ("rules", []),
    ):
        subprocess.run(
            [*medic, target, *flags, *more],
            check=True,
            cwd=REPO,
            timeout=120,
            stdout=subprocess.DEVNULL,
        )
    # Prometheus scrapes itself too, so its rule-evaluation metrics can be queried.
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    config["scrape_configs"].append(
        {"job_name": "prometheus", "static_configs": [{"targets": [f"{PROMETHEUS}:9090"]}]}
    )
    (out / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def free_on(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"{host}:{port} is taken ({exc}): another run uses it") from None


@contextlib.contextmanager
def started(argvs: dict[str, list[str]], workdir: Path) -> Iterator[dict[str, int]]:
    """{name: pid}; each started here (output to workdir/NAME.log) and ended by its pid."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in argvs.items():
            with (workdir / f"{name}.log").open("wb") as log:
                children[name] = subprocess.Popen(
                    argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
        yield {name: child.pid for name, child in children.items()}
    finally:
        for child in children.values():
            child.terminate()
        for child in children.values():
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return bytes(answer.read())


def query(promql: str) -> list[dict]:
    url = f"http://{PROMETHEUS}:9090/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    return list(json.loads(get(url))["data"]["result"])


def scalar(promql: str) -> float:
    result = query(promql)
    return float(result[0]["value"][1]) if result else float("nan")


def own_metric(name: str) -> float:
    """One of Prometheus's own process metrics, from its /metrics."""
    for line in get(f"http://{PROMETHEUS}:9090/metrics").decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            if predicate():
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=3.0, help="measured time")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus is not installed (Debian package prometheus)")
    for index in range(1, args.nodes + 1):
        free_on(address(index), EXPORTER_PORT)
    free_on(PROMETHEUS, 9090)
    token = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"mlx-medic-bench-alerts-{token}-", dir="/var/tmp"))
    names = [f"ai{i:03d}" for i in range(1, args.nodes + 1)]
    try:
        inventory = write_inventory(workdir, args.nodes, args.models)
        rendered = render(workdir, inventory)
        argvs = {
            name: busy_node.our_exporter(
                inventory,
                name,
                "--state-dir",
                str(workdir / f"state-{name}"),
                "--web.listen-address",
                f"{address(index)}:{EXPORTER_PORT}",
            )
            for index, name in enumerate(names, start=1)
        }
        argvs["prometheus"] = [
            prometheus,
            f"--config.file={rendered / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address={PROMETHEUS}:9090",
        ]
        with started(argvs, workdir) as pids:
            wait_until(
                lambda: scalar('count(up{job="mlx-medic-exporter"} == 1)') == args.nodes,
                120,
                f"Prometheus to scrape all {args.nodes} exporters",
            )
            wait_until(
                lambda: scalar("min(prometheus_rule_group_last_duration_seconds)") > 0,
                60,
                "the first rule evaluation",
            )
            cpu0 = own_metric("process_cpu_seconds_total")
            exporters0 = sum(cpu_seconds(pids[name]) for name in names)
            started_at = time.monotonic()
            time.sleep(args.minutes * 60)
            elapsed = time.monotonic() - started_at
            prometheus_cpu = own_metric("process_cpu_seconds_total") - cpu0
            exporters_cpu = sum(cpu_seconds(pids[name]) for name in names) - exporters0
            window = f"{int(elapsed)}s"
            groups = query("prometheus_rule_group_last_duration_seconds")
            median = query(
                f"quantile_over_time(0.5, prometheus_rule_group_last_duration_seconds[{window}])"
            )
            rules_of = {
                r["metric"]["rule_group"]: float(r["value"][1])
                for r in query("prometheus_rule_group_rules")
            }
            series = scalar("prometheus_tsdb_head_series")
            exporter_series = scalar('count({job="mlx-medic-exporter"})')
            samples = query('scrape_samples_scraped{job="mlx-medic-exporter"}')
            durations = query('scrape_duration_seconds{job="mlx-medic-exporter"}')
            firing = query('count by (alertname) (ALERTS{alertstate="firing"})')
            rss = own_metric("process_resident_memory_bytes")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    scrapes = args.nodes * elapsed / 15
    per_target = [float(s["value"][1]) for s in samples]
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {get_version(prometheus)}; load average "
        f"{os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"{args.nodes} exporters, {args.models} models of {PER_MODEL} nodes, 15 s scrape and "
        f"evaluation intervals, {elapsed:.0f} s measured\n"
    )
    print("| rule group | rules | last evaluation ms | median over the run ms |")
    print("|---|---:|---:|---:|")
    medians = {g["metric"]["rule_group"]: float(g["value"][1]) for g in median}
    for group in groups:
        name = group["metric"]["rule_group"]
        count = rules_of.get(name, float("nan"))
        print(
            f"| {name.rsplit(';', 1)[-1]} | {count:.0f} | {float(group['value'][1]) * 1000:.2f} |"
            f" {medians.get(name, float('nan')) * 1000:.2f} |"
        )
    print(
        f"\nrules {sum(rules_of.values()):.0f}; head series {series:.0f}, of which the exporters' "
        f"{exporter_series:.0f} ({exporter_series / args.nodes:.0f} per node)"
    )
    print(
        f"samples per exporter scrape: median {statistics.median(per_target):.0f}, "
        f"min {min(per_target):.0f}, max {max(per_target):.0f}; scrape duration median "
        f"{statistics.median(float(d['value'][1]) for d in durations) * 1000:.1f} ms"
    )
    print(
        f"Prometheus: {prometheus_cpu / elapsed * 1000:.1f} ms CPU per second "
        f"({prometheus_cpu:.2f} s over {elapsed:.0f} s), RSS {rss / 2**20:.0f} MiB"
    )
    print(
        f"exporters: {exporters_cpu / scrapes * 1000:.1f} ms CPU per scrape each "
        f"({exporters_cpu:.2f} s over about {scrapes:.0f} scrapes, background probes included)"
    )
    print(
        "alerts firing: "
        + (", ".join(f"{a['metric']['alertname']} {a['value'][1]}" for a in firing) or "none")
    )
    return 0


def get_version(binary: str) -> str:
    said = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (said.stdout + said.stderr).strip().splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
