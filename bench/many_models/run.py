#!/usr/bin/env python3
"""Many models down at once: the remediator's engine recovering 8 models on 24 testbed
nodes together, against one model alone, in one run.

A testbed of `--nodes` real sshd nodes (PID + mount namespaces on 127.0.0.N); `--models`
models of three nodes each, each served by a stub rank that answers the health probe (a
one-token chat completion, tests/node/test_sweep_clean_testbed.py's server) run by
supervisord inside the model's head as its KeepAlive service (testbed.keepalive). The
engine runs in this process over real SSH (`SshTransport`) with the real `recover`
playbook: re-check over SSH on the head, the model lock, preflight, stop the service,
sweep and clean the three nodes, start the service, verify with the probe. The service
steps ask supervisord over the socket each model's config names (`node service`; it ran
supervisorctl before 2026-12-05 05:04).
The nodes' mlx-medic is a wheel of this checkout in a plain venv under the bench's
workdir, as production installs it (bench/node_install.py; until 2026-12-04 a shim ran
the dev venv's editable install, whose import hook runs at every start).

The engine's helper calls go through one helper session per node (`mlx-medic node
session`, a child forked per call; from 2026-12-05), or a process per call with
`--process-per-call` (`ssh.helper_sessions: false`). A first recovery of every model,
not measured, opens each node's connection and session, as in a remediator that has run
(before 2026-12-05 it recovered one model, opening three nodes' connections).

Each round: every model's program is stopped with supervisorctl (all down at once), an
`LLMModelDown` alert per model is submitted together, and the time until every run has
ended is taken (wall), with this process's CPU over it (the remediator: engine, asyncssh;
the node helpers run in the nodes and are not in it). Then one model is stopped and
recovered alone, the same way. The two alternate which goes first. Every run must end
succeeded, one run per model per round.

    python3 bench/many_models/run.py [--nodes 24] [--models 8] [--rounds 3] [--parallel 8]
        [--process-per-call]

Run as root on Linux. Everything it starts ends with the testbed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from bench.node_install import install_node_medic  # noqa: E402
from mlx_medic.inventory.load import load_inventory  # noqa: E402
from mlx_medic.remediator.alerts import Disposition  # noqa: E402
from mlx_medic.remediator.config import RemediatorConfig  # noqa: E402
from mlx_medic.remediator.engine import Engine  # noqa: E402
from mlx_medic.remediator.journal import Journal, RunView  # noqa: E402
from mlx_medic.transport.ssh import SshTransport  # noqa: E402
from testbed import Cluster, free_port, start_cluster  # noqa: E402
from testbed.keepalive import KeepAlive, keep_alive  # noqa: E402
from tests.node.test_sweep_clean_testbed import HEALTHY_SERVER  # noqa: E402
from tests.remediator.engine_fakes import alert  # noqa: E402

PER_MODEL = 3


def serve_models(
    cluster: Cluster, workdir: Path, models: int, sessions: bool
) -> tuple[Path, list[KeepAlive]]:
    """(the inventory, each model's KeepAlive service on its head, serving)."""
    stub = workdir / "stub_rank.py"
    stub.write_text(HEALTHY_SERVER)
    entries: list[dict[str, Any]] = []
    services = []
    for m in range(models):
        members = [cluster.nodes[PER_MODEL * m + k].name for k in range(PER_MODEL)]
        port = free_port()
        service = keep_alive(
            cluster.node(members[0]),
            [cluster.python, str(stub), "--port", str(port)],
            workdir=workdir / f"m{m}",
            throttle=0.2,
            env=cluster.env(),
            name=f"m{m}-{uuid.uuid4().hex[:6]}",
        )
        services.append(service)
        entries.append(
            {
                "name": f"m{m}",
                "model": f"bench/model-{m}",
                "nodes": members,
                "port": port,
                "service": {
                    "manager": "supervisord",
                    "label": service.program,
                    "config": str(service.conf),
                },
                "backends": {"ring": {"hostfile": str(workdir / f"m{m}.json")}},
                "policy": {"restart_budget": 100, "backoff": 0, "start_timeout": "60s"},
            }
        )
    inventory = workdir / "inventory.yaml"
    # The nodes run this tree's mlx-medic, installed from a wheel as on a production node.
    medic = install_node_medic(workdir / "node-medic")
    data = yaml.safe_load(cluster.inventory_yaml(entries))
    data["ssh"]["helper_sessions"] = sessions
    for node in data["nodes"].values():
        node.update(medic_command=str(medic), medic_config=str(inventory))
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return inventory, services


def stop(services: list[KeepAlive]) -> None:
    for service in services:
        result = service.ctl("stop", service.program)
        if result.returncode != 0:
            raise RuntimeError(f"supervisorctl stop {service.program}: {result.stderr}")


async def recover(engine: Engine, models: list[str]) -> tuple[float, float]:
    """(wall s, this process's CPU s) from the alerts' submission to the last run's end."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    before = len(engine.journal.list_runs(limit=10_000))
    submitted = await asyncio.gather(
        *(engine.submit(alert(uuid.uuid4().hex[:16], model)) for model in models)
    )
    if any(d != Disposition.STARTED for d in submitted):
        raise RuntimeError(f"not every alert started a run: {submitted}")
    await engine.wait_idle(900)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    runs = engine.journal.list_runs(limit=10_000)
    if len(runs) - before != len(models):
        raise RuntimeError(f"{len(runs) - before} runs for {len(models)} models")
    for run in runs[: len(models)]:  # the newest first
        if run.outcome != "succeeded":
            steps = [(s.name, s.outcome, s.detail) for s in run.steps]
            raise RuntimeError(f"{run.model}: {run.outcome}: {run.detail} {steps}")
    print(f"  {len(models)} model(s), steps in s, slowest run's: {steps_of(runs[: len(models)])}")
    return wall, cpu


def steps_of(runs: list[RunView]) -> str:
    """The slowest run's steps, each with its duration, and its queued-to-start wait."""
    run = max(runs, key=lambda r: (r.ended_at or 0) - r.queued_at)
    said = [f"queued {(run.started_at or run.queued_at) - run.queued_at:.2f}"]
    said += [f"{s.name} {(s.ended_at or s.started_at) - s.started_at:.2f}" for s in run.steps]
    return ", ".join(said)


async def rounds(inventory_path: Path, workdir: Path, services: list[KeepAlive], args) -> dict:  # type: ignore[no-untyped-def]
    inventory = load_inventory(inventory_path)
    settings = {
        "journal": str(workdir / "journal.sqlite"),
        "routing": {"playbooks": {"LLMModelDown": "recover"}},
        "max_parallel_runs": args.parallel,
    }
    config = RemediatorConfig.model_validate(settings)
    transport = SshTransport(inventory)
    engine = Engine(
        config, inventory, Journal(config.journal), transport, registry=CollectorRegistry()
    )
    await engine.start()
    names = [m.name for m in inventory.models]
    taken: dict[str, list[tuple[float, float]]] = {"all": [], "alone": []}
    try:
        # A first recovery of every model opens each node's SSH connection and helper
        # session, as a remediator that has run has them (not measured).
        stop(services)
        await recover(engine, names)
        for index in range(args.rounds):
            order = ["all", "alone"] if index % 2 == 0 else ["alone", "all"]
            for way in order:
                chosen = services if way == "all" else services[:1]
                stop(chosen)
                taken[way].append(await recover(engine, names if way == "all" else names[:1]))
                wall, cpu = taken[way][-1]
                print(f"round {index + 1} {way}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    finally:
        await engine.close()
        await transport.close()
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=8, help="max_parallel_runs")
    parser.add_argument(
        "--process-per-call",
        action="store_true",
        help="no helper sessions: each helper call a process of its own"
        " (ssh.helper_sessions: false)",
    )
    args = parser.parse_args()
    if args.models * PER_MODEL > args.nodes:
        parser.error(f"{args.models} models of {PER_MODEL} nodes need {args.models * 3} nodes")
    token = uuid.uuid4().hex[:8]
    workdir = Path("/var/tmp") / f"mlx-medic-bench-models-{token}"
    workdir.mkdir()
    try:
        with start_cluster(args.nodes, workdir / "cluster") as cluster:
            inventory, services = serve_models(
                cluster, workdir, args.models, not args.process_per_call
            )
            try:
                taken = asyncio.run(rounds(inventory, workdir, services, args))
            finally:
                for service in services:
                    service.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    all_wall = statistics.median(w for w, _ in taken["all"])
    alone_wall = statistics.median(w for w, _ in taken["alone"])
    print(
        f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the end"
    )
    way = "a process per call" if args.process_per_call else "one helper session per node"
    print(
        f"{args.nodes} nodes, {args.models} models of {PER_MODEL} nodes, max_parallel_runs "
        f"{args.parallel}, {args.rounds} rounds; helper calls: {way}; medians"
    )
    print("| | wall s | remediator CPU s |")
    print("|---|---:|---:|")
    for way, label in (("alone", "one model alone"), ("all", f"{args.models} models at once")):
        print(
            f"| {label} | {statistics.median(w for w, _ in taken[way]):.2f} |"
            f" {statistics.median(c for _, c in taken[way]):.2f} |"
        )
    print(f"ratio (all / alone, wall): {all_wall / alone_wall:.2f}")
    print("all:", " ".join(f"{w:.2f}/{c:.2f}" for w, c in taken["all"]))
    print("alone:", " ".join(f"{w:.2f}/{c:.2f}" for w, c in taken["alone"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
