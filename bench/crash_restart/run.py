"""Crash after crash: `mlx-medic serve` against seed 000's final fix, on the same testbed.

Both run as the model's service under a KeepAlive stand-in (supervisord inside the head,
behind `testbed.throttle`: at most one spawn every `--throttle` seconds, as launchd's
ThrottleInterval), on two testbed nodes (real sshd namespaces, real mlx.launch, the tiny
model served by real mlx_lm.server) with the testbed's simulated JACCL (finite pools of
`--capacity` protection domains per device; an orphaned JACCL rank stays killable for
`--killable-for` seconds, then freezes in state D until the node "reboots").

- The anchor: the seed's final fix as its write-up shows it (testbed/seed_fixes.py), as
  the service's start script: its PID-file lock; on every node in turn (the head
  locally, each peer over `ssh -o BatchMode=yes -o ConnectTimeout=5`) `pgrep -f` the
  model's server by its port and `kill -9` each match unless something listens on the
  port (`lsof`); `find CACHE -maxdepth 1 -name 'tmp*' -exec rm -rf {} +`; then `exec
  mlx.launch --backend jaccl`.
- Ours: `mlx-medic serve MODEL` with the model's JACCL and ring backends, the default
  policy but `pd_reserve` (`--reserve`, against the small pool).

A fault is the seed's crash: mlx.launch and the head's rank SIGKILLed together, some
seconds after the model answered. Measured per crash: the seconds from the fault to the
first good answer (a real one-token completion, asked every 0.1 s), and after it the
domains in use in each node's pool (the truth) and which backend serves. Scenarios:
`plain`, and `frozen`: before the service starts, a real `mlx.launch` of the model (no
mlx-medic) crashed the same way, its peer rank left to freeze (the seed's `Us+`
survivor). Each contestant starts on freshly "rebooted" nodes (pools empty, new boot
ids). Modes: `release` (a domain comes back when its holder dies) and `keep` (a SIGKILLed
holder keeps its domains until reboot). Run as root on Linux:

    .venv/bin/python bench/crash_restart/run.py --crashes 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mlx_medic.health import probe_model  # noqa: E402
from mlx_medic.serve.record import read_serve_record  # noqa: E402
from mlx_medic.state.ledger import read_ledger  # noqa: E402
from testbed import Cluster, free_port, start_cluster  # noqa: E402
from testbed.faults import frozen_survivor, seed_crash  # noqa: E402
from testbed.jaccl_sim import JacclSim, start_jaccl_sim  # noqa: E402
from testbed.keepalive import KeepAlive, keep_alive  # noqa: E402
from testbed.seed_fixes import SeedModel, write_seed_script  # noqa: E402
from testbed.tiny_model import make_tiny_model  # noqa: E402

NODES = ["ai001", "ai002"]
MEDIC = str(Path(sys.executable).parent / "mlx-medic")
LAUNCH = str(Path(sys.executable).parent / "mlx.launch")


@dataclass
class Crash:
    seconds: float | None  # None: no answer within the limit
    in_use: dict[str, int]  # node -> domains in use in its pool after
    backend: str


@dataclass
class Outcome:
    contestant: str
    first_answer: float | None
    crashes: list[Crash] = field(default_factory=list)
    down_because: str = ""


def answers(port: int) -> bool:
    return probe_model("127.0.0.1", port, timeout=5.0).up


def wait_answer(port: int, limit: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if answers(port):
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def backend_of(cluster: Cluster, contestant: str) -> str:
    if contestant == "serve":
        record = read_serve_record(cluster.head.state_dir, "tiny")
        return (record.backend or "?") if record else "?"
    return "jaccl"


def inventory(
    cluster: Cluster,
    sim: JacclSim,
    work: Path,
    model: Path,
    port: int,
    starting_port: int,
    reserve: int,
    throttle: float,
) -> Path:
    path = work / "inventory.yaml"
    spec = {
        "name": "tiny",
        "model": str(model),
        "nodes": NODES,
        "port": port,
        "service": {"manager": "supervisord", "label": "tiny"},
        "backends": {
            "jaccl": {
                "hostfile": str(cluster.hostfile(work / "jaccl.json", NODES, backend="jaccl"))
            },
            "ring": {"hostfile": str(cluster.hostfile(work / "ring.json", NODES))},
        },
        "serve_args": {"prefill-step-size": 256},
        # the wrapper's own relaunches spaced as the service manager's throttle spaces the
        # anchor's restarts (launchd: ThrottleInterval, 10 s by default; here --throttle)
        "serve": {
            **sim.serve_settings(),
            "starting_port": starting_port,
            "identity_file": str(cluster.identity),
            "relaunch_interval": throttle,
        },
        "policy": {"pd_reserve": reserve},
    }
    data = yaml.safe_load(cluster.inventory_yaml([spec]))
    for node in data["nodes"].values():
        node.update({"medic_command": MEDIC, "medic_config": str(path)})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_one(
    cluster: Cluster, sim: JacclSim, contestant: str, scenario: str, args, model: Path
) -> Outcome:
    for node in NODES:  # a fresh boot: empty pools, new boot ids, nothing left
        cluster.reboot(node)
        cluster.node(node).wipe_private_dirs()
    work = cluster.workdir / f"{contestant}-{scenario}-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    port, starting_port = free_port(), 42000 + (os.getpid() % 200) * 20
    hostfile = cluster.hostfile(work / "jaccl.json", NODES, backend="jaccl")
    if scenario == "frozen":
        frozen_survivor(
            cluster,
            sim,
            model=model,
            port=port,
            hostfile=hostfile,
            starting_port=starting_port + 100,
            log=work / "earlier.log",
        )
    env = cluster.env(HF_HUB_OFFLINE="1")
    if contestant == "anchor":
        script = write_seed_script(
            work / "mlx-preseed.sh",
            "final-fix",
            SeedModel(
                short="tiny",
                model=model,
                port=port,
                hostfile=hostfile,
                python=str(sim.python),
                launch=LAUNCH,
                cache=cluster.head.cache_mount,
                peers=("ai002",),
            ),
        )
        command = ["bash", str(script)]
    else:
        config = inventory(
            cluster, sim, work, model, port, starting_port, args.reserve, args.throttle
        )
        command = [MEDIC, "serve", "tiny", "--inventory", str(config)]
    started = time.monotonic()
    service: KeepAlive = keep_alive(
        cluster.head,
        command,
        workdir=work,
        throttle=args.throttle,
        env=env,
        name=f"tiny-{contestant}",
    )
    outcome = Outcome(contestant, None)
    try:
        first = wait_answer(port, args.limit)
        outcome.first_answer = None if first is None else time.monotonic() - started
        if first is None:
            outcome.down_because = last_error(service)
            return outcome
        for _ in range(args.crashes):
            time.sleep(args.serve_for)
            seed_crash(cluster, port)
            took = wait_answer(port, args.limit)
            outcome.crashes.append(
                Crash(took, {n: sim.in_use(n) for n in NODES}, backend_of(cluster, contestant))
            )
            if took is None:
                outcome.down_because = last_error(service)
                break
        if contestant == "serve":
            (work / "ledgers.txt").write_text(
                "\n".join(
                    f"{n}: {read_ledger(cluster.node(n).state_dir, n, cluster.node(n).boot_id)}"
                    for n in NODES
                )
            )
        return outcome
    finally:
        service.close()
        for node in cluster.nodes:
            node.kill_all_but_sshd()


def last_error(service: KeepAlive) -> str:
    lines = [line for line in service.output().splitlines() if "Error" in line or "failed" in line]
    return lines[-1][-200:] if lines else "(no error line)"


def table(results: list[tuple[str, str, Outcome, Outcome]], crashes: int) -> str:
    out = [
        "| mode | scenario | crash | anchor s | serve s | ratio | anchor domains in use"
        " (ai001/ai002) | serve domains in use | serve backend |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for mode, scenario, anchor, serve in results:
        out.append(
            f"| {mode} | {scenario} | first answer | {fmt(anchor.first_answer)} |"
            f" {fmt(serve.first_answer)} | {ratio(serve.first_answer, anchor.first_answer)}"
            " | | | |"
        )
        for index in range(crashes):
            a = anchor.crashes[index] if index < len(anchor.crashes) else None
            s = serve.crashes[index] if index < len(serve.crashes) else None
            out.append(
                f"| {mode} | {scenario} | {index + 1} | {fmt(a.seconds if a else None)} |"
                f" {fmt(s.seconds if s else None)} |"
                f" {ratio(s.seconds if s else None, a.seconds if a else None)} |"
                f" {pools(a)} | {pools(s)} | {s.backend if s else ''} |"
            )
    return "\n".join(out)


def fmt(value: float | None) -> str:
    return "down" if value is None else f"{value:.1f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None:
        return "-"
    return f"{ours / theirs:.2f}"


def pools(crash: Crash | None) -> str:
    return "" if crash is None else "/".join(str(crash.in_use[n]) for n in NODES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--modes", default="release,keep")
    parser.add_argument("--scenarios", default="plain,frozen")
    parser.add_argument("--throttle", type=float, default=3.0)
    parser.add_argument("--capacity", type=int, default=3)
    parser.add_argument("--killable-for", type=float, default=20.0)
    parser.add_argument("--reserve", type=int, default=2)
    parser.add_argument(
        "--serve-for", type=float, default=3.0, help="seconds the model serves before each crash"
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=120.0,
        help="seconds to wait for an answer before calling it down",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the workdir (the services' logs) and print where it is",
    )
    args = parser.parse_args()
    workdir = Path("/var/tmp") / f"mlx-medic-bench-crash-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    model = make_tiny_model(workdir / "tiny-model")
    results = []
    with start_cluster(len(NODES), workdir / "cluster") as cluster:
        for mode in args.modes.split(","):
            sim = start_jaccl_sim(
                cluster,
                on_sigkill=mode,
                capacity=args.capacity,  # type: ignore[arg-type]
                killable_for=args.killable_for,
            )
            try:
                for number, scenario in enumerate(args.scenarios.split(",")):
                    order = ["anchor", "serve"] if number % 2 == 0 else ["serve", "anchor"]
                    found = {
                        who: run_one(cluster, sim, who, scenario, args, model) for who in order
                    }
                    results.append((mode, scenario, found["anchor"], found["serve"]))
                    for who in order:
                        outcome = found[who]
                        down = f", down: {outcome.down_because}" if outcome.down_because else ""
                        print(
                            f"{mode} {scenario} {who}: first {fmt(outcome.first_answer)},"
                            f" crashes {[fmt(c.seconds) for c in outcome.crashes]},"
                            f" pools {[pools(c) for c in outcome.crashes]}{down}",
                            flush=True,
                        )
            finally:
                sim.close()
    print()
    print(table(results, args.crashes))
    serve = [c.seconds for _, _, _, s in results for c in s.crashes if c.seconds is not None]
    anchor = [c.seconds for _, _, a, _ in results for c in a.crashes if c.seconds is not None]
    if serve and anchor:
        print(
            f"\nmedian seconds from crash to first answer: anchor"
            f" {statistics.median(anchor):.1f}, serve {statistics.median(serve):.1f}"
            f" ({statistics.median(serve) / statistics.median(anchor):.2f}x)"
        )
    if args.keep:
        print(f"\nlogs kept in {workdir}")
    else:
        with contextlib.suppress(OSError):
            import shutil

            shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
