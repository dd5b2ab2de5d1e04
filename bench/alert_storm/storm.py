"""Alert storm against the real remediator, beside a bare aiohttp handler, same generator.

Runs (as root: the model locks live on a simulated head node reached over real SSH):
  python bench/alert_storm/storm.py [--requests 20000] [--concurrency 16] [--rounds 3]

Each round starts the bare handler and then a fresh `mlx-medic remediator` (its own
journal), each as its own process, and storms each from a separate load-generator
process (loadgen.py). The remediator routes the storm's alert to a playbook that holds
the model for a minute, so every model has a run in progress through the whole storm:
the first firing per model starts a run, later new firings are absorbed, repeats are
duplicates. After the storm the journal is read: exactly one run per model is the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from mlx_medic.remediator.journal import Journal  # noqa: E402
from testbed import free_port, start_cluster  # noqa: E402

HOLD_PLAYBOOK = "slow"  # tests.remediator.slow_playbook: holds a model for 60 s
# The remediator's entry point with the test playbooks registered beside the built-ins.
SERVICE = ["-m", "tests.remediator.service_with_test_playbooks"]


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process: robust to a busy machine, unlike wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def storm_measured(
    url: str, args: argparse.Namespace, token_file: Path | None, pid: int
) -> dict[str, Any]:
    before = cpu_seconds(pid)
    result = loadgen(url, args, token_file)
    used = cpu_seconds(pid) - before
    result["server_cpu_seconds"] = round(used, 3)
    result["server_cpu_us_per_request"] = round(used / result["requests"] * 1e6, 1)
    result["server_capacity_rps_per_core"] = round(result["requests"] / used, 1) if used else None
    return result


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def loadgen(url: str, args: argparse.Namespace, token_file: Path | None) -> dict[str, Any]:
    if args.generator == "wrk":
        return wrk(url, args, token_file)
    argv = [
        sys.executable,
        str(HERE / "loadgen.py"),
        "--url",
        url,
        "--requests",
        str(args.requests),
        "--concurrency",
        str(args.concurrency),
        "--models",
        str(args.models),
        "--repeat",
        str(args.repeat),
    ]
    if token_file:
        argv += ["--token-file", str(token_file)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env())
    return json.loads(done.stdout)


def wrk(url: str, args: argparse.Namespace, token_file: Path | None) -> dict[str, Any]:
    """wrk (C, one thread) with storm.lua: the load generator costs the machine little."""
    sys.path.insert(0, str(HERE))
    from loadgen import plan

    bodies, unique = plan(args.bodies, args.models, args.repeat, args.seed)
    bodies_file = Path(args.workdir) / "bodies.jsonl"
    bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
    argv = [
        "wrk",
        "-t1",
        f"-c{args.concurrency}",
        f"-d{args.duration}s",
        "-s",
        str(HERE / "storm.lua"),
        url,
        "--",
        str(bodies_file),
    ]
    if token_file:
        argv.append(token_file.read_text().strip())
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["new_firings_in_bodies"] = unique
    return result


def stop(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    """SIGTERM, and SIGKILL after `grace` seconds (a server whose event loop is held)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bare_round(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "bare.py"), "--port", str(port)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        return storm_measured(f"http://127.0.0.1:{port}/alerts", args, None, proc.pid)
    finally:
        stop(proc)


def remediator_round(
    args: argparse.Namespace, workdir: Path, inventory: Path, n: int
) -> dict[str, Any]:
    rounddir = workdir / f"round-{n}"
    rounddir.mkdir()
    token = rounddir / "token"
    token.write_text(uuid.uuid4().hex + "\n")
    journal_path = rounddir / "journal.sqlite"
    config = rounddir / "remediator.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "inventory": str(inventory),
                "journal": str(journal_path),
                "auth": {"bearer_token_file": str(token)},
                "routing": {"playbooks": {"LLMModelDown": HOLD_PLAYBOOK}},
                # Nothing listens on the models' ports: probed from here they are down, so each
                # first firing's run acts (holds its model) instead of asking the head over SSH.
                "probe_from": "remediator",
            }
        )
    )
    port = free_port()
    with (rounddir / "remediator.log").open("wb") as log:  # one JSON line per request
        profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
        proc = subprocess.Popen(
            [
                sys.executable,
                *profile,
                *SERVICE,
                "--log.format",
                "json",  # one JSON line per request, read below
                "--config.file",
                str(config),
                "--web.listen-address",
                f"127.0.0.1:{port}",
            ],
            cwd=REPO,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        wait_port(port, proc)
        result = storm_measured(f"http://127.0.0.1:{port}/alerts", args, token, proc.pid)
    finally:
        stop(proc)
    journal = Journal(journal_path)
    runs: dict[str, int] = {}
    for run in journal.list_runs(limit=10_000):
        runs[run.model] = runs.get(run.model, 0) + 1
    journal.close()
    result["runs_per_model"] = runs
    decided: dict[str, int] = {}
    for line in (rounddir / "remediator.log").open():  # the service's one line per request
        entry = json.loads(line)
        for disposition in entry.get("dispositions", []):
            decided[disposition] = decided.get(disposition, 0) + 1
    result["dispositions_logged"] = decided
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--generator",
        choices=["wrk", "python"],
        default="wrk",
        help="wrk (Debian's, with storm.lua) or loadgen.py (aiohttp client)",
    )
    parser.add_argument("--duration", type=int, default=30, help="seconds per storm (wrk)")
    parser.add_argument(
        "--bodies",
        type=int,
        default=200_000,
        help="distinct deliveries prepared for wrk, sent in order",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=20_000, help="per storm (python)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--repeat", type=float, default=0.9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="run the remediator under cProfile, stats to this file",
    )
    args = parser.parse_args()

    workdir = Path("/var/tmp") / f"mlx-medic-bench-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    args.workdir = str(workdir)
    cluster = start_cluster(1, workdir / "cluster")
    try:
        models = [
            {
                "name": f"m{i}",
                "model": "tiny",
                "nodes": ["ai001"],
                "port": free_port(),
                "service": {"manager": "supervisord", "label": f"mlx-m{i}"},
                "backends": {"ring": {"hostfile": str(workdir / f"m{i}.json")}},
                "policy": {"backoff": 0},
            }
            for i in range(args.models)
        ]
        inventory = workdir / "inventory.yaml"
        inventory.write_text(cluster.inventory_yaml(models))
        rounds = []
        for n in range(args.rounds):
            bare = bare_round(args, workdir)
            real = remediator_round(args, workdir, inventory, n)
            rounds.append({"bare": bare, "remediator": real})
            print(json.dumps(rounds[-1]), file=sys.stderr)
    finally:
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(kind: str, key: str) -> float:
        return round(statistics.median(r[kind][key] for r in rounds), 2)

    one_run_each = all(
        r["remediator"]["runs_per_model"] == {f"m{i}": 1 for i in range(args.models)}
        for r in rounds
    )
    summary: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "median": {
            kind: {
                key: median(kind, key)
                for key in (
                    "requests_per_second",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "server_cpu_us_per_request",
                    "server_capacity_rps_per_core",
                )
            }
            for kind in ("bare", "remediator")
        },
        "exactly_one_run_per_model_every_round": one_run_each,
        "rounds": rounds,
    }
    summary["ratio_rps_remediator_to_bare"] = round(
        summary["median"]["remediator"]["requests_per_second"]
        / summary["median"]["bare"]["requests_per_second"],
        3,
    )
    summary["ratio_cpu_per_request_remediator_to_bare"] = round(
        summary["median"]["remediator"]["server_cpu_us_per_request"]
        / summary["median"]["bare"]["server_cpu_us_per_request"],
        3,
    )
    summary["load_average_after"] = os.getloadavg()
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
