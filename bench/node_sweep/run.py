"""Sweeping one model on N testbed nodes (four by default): ours against the seed's loop.

Ours: the nodes in parallel over asyncssh (`mlx_medic.transport.ssh.SshTransport`,
one connection per node, kept from repetition to repetition as the remediator keeps
them), each running `mlx-medic node sweep MODEL --json --inventory INVENTORY`, through
the node's helper session (a child forked per call, `mlx-medic node session`, opened by
the first repetition and kept as the remediator keeps it; from 2026-12-05), or as a
process per call with `--process-per-call` (`ssh.helper_sessions: false`). The
nodes' mlx-medic is a wheel of this checkout in a plain venv under the bench's workdir,
as production installs it (bench/node_install.py; until 2026-12-04 a shim ran the dev
venv's editable install, whose import hook runs at every start). The inventory is new
in every run, so the first repetition's helpers validate it in full and snapshot it
(mlx_medic.inventory.snapshot); later ones read the snapshot.

The seed's (the pre-start sweep of the incident write-up,
https://valensas.com/blog/how-we-fixed-a-silent-killer-in-our-mac-studio-llm-cluster): node
after node, a fresh `ssh -o BatchMode=yes -o ConnectTimeout=5 NODE '...'` whose script
is the seed's own, the port guard (lsof) and then `pgrep -f` + `kill -9`:

    if [ -n "$port" ] && ! lsof -iTCP:"$port" -sTCP:LISTEN >/dev/null 2>&1; then
        for pid in $(pgrep -f "serve\\.py .*--port $port" 2>/dev/null); do
            echo "[preseed] cleanup: killing orphaned serve.py pid=$pid"
            kill -9 "$pid" 2>/dev/null
        done
    fi

Each repetition first makes the same orphans on every node (`--orphans` per node: the
seed's `serve.py --model M --port P` ranks with MLX_RANK set, whose starting shell has
exited so the node's pid 1 adopted them: launcher gone), then times one sweep of all
nodes, then checks that none of the orphans is left. The two ways alternate which
goes first. Run as root on Linux (the testbed needs namespaces):

    .venv/bin/python bench/node_sweep/run.py --repetitions 7 --orphans 3 [--process-per-call]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.node_install import install_node_medic  # noqa: E402
from mlx_medic.inventory.load import load_inventory  # noqa: E402
from mlx_medic.transport.ssh import SshTransport  # noqa: E402
from testbed import Cluster, free_port, processes, start_cluster  # noqa: E402

NODES = ["ai001", "ai002", "ai003", "ai004"]  # --nodes N: ai001 to aiN
RANK = "import time\ntime.sleep(3600)\n"


def seed_script(port: int) -> str:
    return (
        f'port={port}; if [ -n "$port" ] && ! lsof -iTCP:"$port" -sTCP:LISTEN >/dev/null 2>&1;'
        ' then for pid in $(pgrep -f "serve\\.py .*--port $port" 2>/dev/null); do'
        ' echo "[preseed] cleanup: killing orphaned serve.py pid=$pid";'
        ' kill -9 "$pid" 2>/dev/null; done; fi'
    )


def make_orphans(cluster: Cluster, script: Path, model: str, port: int, count: int) -> list[int]:
    """`count` orphaned ranks on every node (host pids): started by a shell that exits."""
    rank = shlex.join([cluster.python, str(script), "--model", model, "--port", str(port)])
    started = []
    for name in NODES:
        node = cluster.node(name)
        before = set(node.host_pids())
        line = " ".join(
            f"MLX_RANK={i} setsid {rank} </dev/null >/dev/null 2>&1 &" for i in range(count)
        )
        node.spawn(["sh", "-c", line], env=cluster.env()).wait(timeout=30)
        deadline = time.monotonic() + 30
        while True:
            found = [
                p
                for p in set(node.host_pids()) - before
                if str(script) in " ".join(processes.cmdline(p))
            ]
            if len(found) == count:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {len(found)} of {count} orphans started")
            time.sleep(0.02)
        started += found
    return started


def left(pids: list[int]) -> list[int]:
    return [p for p in pids if processes.is_alive(p)]


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Killed processes are reaped by the node's pid 1 a moment later."""
    deadline = time.monotonic() + timeout
    while left(pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left(pids)


def seed_sweep(cluster: Cluster, port: int) -> None:
    for name in NODES:
        subprocess.run(
            cluster.node(name).ssh_argv(
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", seed_script(port)
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )


async def our_sweep(
    transport: SshTransport, inventory, argv: list[str], names: list[str] = NODES
) -> None:
    nodes = [inventory.node(name) for name in names]
    results = await asyncio.gather(*(transport.run(n, argv, timeout=60) for n in nodes))
    for node, result in zip(nodes, results, strict=True):
        if result.exit_status != 0:
            raise RuntimeError(f"{node.name}: sweep exited {result.exit_status}: {result.stderr}")


def one_node_at_a_time(
    loop, transport, inventory, argv, cluster, script, model, port, count
) -> float:
    """The slowest node swept alone: what machines with their own CPUs would see of our
    parallel sweep (here the nodes' helpers share this machine's cores)."""
    orphans = make_orphans(cluster, script, model, port, count)
    slowest = 0.0
    for name in NODES:
        started = time.perf_counter()
        loop.run_until_complete(our_sweep(transport, inventory, argv, [name]))
        slowest = max(slowest, time.perf_counter() - started)
    if wait_gone(orphans):
        raise RuntimeError("ours, node by node: orphans survive")
    return slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--orphans", type=int, default=3, help="orphans per node")
    parser.add_argument("--nodes", type=int, default=4, help="testbed nodes (at most 200)")
    parser.add_argument(
        "--process-per-call",
        action="store_true",
        help="no helper sessions: each sweep a process of its own (ssh.helper_sessions: false)",
    )
    args = parser.parse_args()
    if not 1 <= args.nodes <= 200:
        parser.error(f"--nodes {args.nodes}: the testbed takes 1 to 200 nodes")
    NODES[:] = [f"ai{index:03d}" for index in range(1, args.nodes + 1)]

    token = uuid.uuid4().hex[:8]
    workdir = Path("/var/tmp") / f"mlx-medic-bench-sweep-{token}"
    try:
        times = measure(workdir, token, args.repetitions, args.orphans, args.process_per_call)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    way = "a process per call" if args.process_per_call else "one helper session per node"
    print(f"\nour helper calls: {way}")
    report(times, args.repetitions, args.orphans)


def measure(
    workdir: Path, token: str, repetitions: int, count: int, process_per_call: bool
) -> dict[str, list[float]]:
    medic = install_node_medic(workdir / "node-medic")
    with start_cluster(len(NODES), workdir) as cluster:
        port = free_port()
        script = workdir / f"seed-{token}" / "serve.py"
        script.parent.mkdir()
        script.write_text(RANK)
        model = f"/models/bench-{token}"
        hostfile = cluster.hostfile(workdir / "ring.json", NODES)
        config = workdir / "inventory.yaml"
        data = yaml.safe_load(
            cluster.inventory_yaml(
                [
                    {
                        "name": "bench",
                        "model": model,
                        "nodes": NODES,
                        "port": port,
                        "service": {"manager": "supervisord", "label": f"bench-{token}"},
                        "backends": {"ring": {"hostfile": str(hostfile)}},
                        "process_patterns": {"rank": [rf"serve\.py --model \S+ --port {port}"]},
                    }
                ]
            )
        )
        data["ssh"]["helper_sessions"] = not process_per_call
        for node in data["nodes"].values():  # the nodes run the installed mlx-medic, as argv
            node.update(medic_command=str(medic), medic_config=str(config))
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        inventory = load_inventory(config)
        argv = [
            str(medic),
            "node",
            "sweep",
            "bench",
            "--json",
            "--inventory",
            str(config),
        ]
        transport = SshTransport(inventory)
        loop = asyncio.new_event_loop()
        times: dict[str, list[float]] = {"seed": [], "ours": [], "alone": []}
        try:
            for repetition in range(repetitions):
                order = ["seed", "ours"] if repetition % 2 == 0 else ["ours", "seed"]
                for way in order:
                    orphans = make_orphans(cluster, script, model, port, count)
                    started = time.perf_counter()
                    if way == "seed":
                        seed_sweep(cluster, port)
                    else:
                        loop.run_until_complete(our_sweep(transport, inventory, argv))
                    times[way].append(time.perf_counter() - started)
                    survivors = wait_gone(orphans)
                    if survivors:
                        raise RuntimeError(f"{way}: orphans survive: {survivors}")
                times["alone"].append(
                    one_node_at_a_time(
                        loop, transport, inventory, argv, cluster, script, model, port, count
                    )
                )
                print(
                    f"repetition {repetition + 1}: seed {times['seed'][-1]:.3f} s,"
                    f" ours {times['ours'][-1]:.3f} s,"
                    f" slowest node alone {times['alone'][-1]:.3f} s",
                    flush=True,
                )
        finally:
            loop.run_until_complete(transport.close())
            loop.close()
    return times


def report(times: dict[str, list[float]], repetitions: int, count: int) -> None:
    cold_seed, cold_ours = times["seed"][0], times["ours"][0]
    warm_seed = statistics.median(times["seed"][1:])
    warm_ours = statistics.median(times["ours"][1:])
    print(f"\n{len(NODES)} nodes, {count} orphans each, {repetitions} repetitions")
    print(
        f"first repetition (ours opens its connections, validates the new inventory):"
        f" seed {cold_seed:.3f} s,"
        f" ours {cold_ours:.3f} s, ratio {cold_ours / cold_seed:.2f}"
    )
    print(
        f"median of the others (connections reused):     seed {warm_seed:.3f} s,"
        f" ours {warm_ours:.3f} s, ratio {warm_ours / warm_seed:.2f}"
    )
    alone = statistics.median(times["alone"][1:])
    print(
        f"median slowest node swept alone (own CPUs):   seed {warm_seed:.3f} s,"
        f" ours {alone:.3f} s, ratio {alone / warm_seed:.2f}"
    )
    print("all seed:", " ".join(f"{t:.3f}" for t in times["seed"]))
    print("all ours:", " ".join(f"{t:.3f}" for t in times["ours"]))
    print("all alone:", " ".join(f"{t:.3f}" for t in times["alone"]))


if __name__ == "__main__":
    main()
