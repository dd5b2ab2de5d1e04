"""The seed's faults, made for real on testbed nodes.

- `seed_crash`: mlx.launch and the head's rank SIGKILLed together (a crash with no
  teardown): the peer's rank is left to its parent `sshd`, and under simulated JACCL it
  hangs instead of exiting.
- `frozen_survivor`: the seed's `Us+` rank, made as the seed made it: a real mlx.launch of
  the model (no mlx-medic), crashed, its peer rank left until it freezes in state D.

Every process is found by the model's port (a token unique to the test) inside the
test's own node namespaces, and ended by pid.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from testbed import processes
from testbed.cluster import Cluster, SimNode, TestbedError
from testbed.jaccl_sim import JacclSim
from testbed.launch import start_launch


def environ(pid: int) -> bytes:
    try:
        return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def launchers(node: SimNode) -> list[int]:
    """Host pids of the node's mlx.launch processes."""
    return [
        pid
        for pid in node.host_pids()
        if any(part.endswith("mlx.launch") for part in processes.cmdline(pid)[:2])
    ]


def model_ranks(node: SimNode, port: int) -> list[int]:
    """Host pids of the node's ranks (MLX_RANK set) serving on `port`, guards excluded."""
    found = []
    for pid in node.host_pids():
        argv = processes.cmdline(pid)
        ours = str(port) in argv and "mlx_lm" in argv and "mlx_medic.serve.guard" not in argv
        if ours and b"\0MLX_RANK=" in environ(pid):
            found.append(pid)
    return found


def seed_crash(cluster: Cluster, port: int) -> list[int]:
    """SIGKILL the head's mlx.launch and its rank of the model together; the pids hit."""
    head = cluster.head
    hit = [*launchers(head), *model_ranks(head, port)]
    for pid in hit:
        processes.kill_quietly(pid, signal.SIGKILL)
    return hit


def frozen_survivor(
    cluster: Cluster,
    sim: JacclSim,
    *,
    model: Path,
    port: int,
    hostfile: Path,
    starting_port: int,
    log: Path,
    peer: str = "ai002",
    timeout: float = 180.0,
) -> int:
    """A real mlx.launch of the model on simulated JACCL, answering, then crashed; returns
    the host pid of its peer rank once that is frozen (state D)."""
    from mlx_medic.health import probe_model

    server = [
        "-m",
        "mlx_lm",
        "server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    earlier = start_launch(
        cluster,
        hostfile,
        server,
        backend="jaccl",
        env=cluster.env(HF_HUB_OFFLINE="1"),
        launch_args=["--python", str(sim.python), "--starting-port", str(starting_port)],
        log_path=log,
    )
    try:
        deadline = time.monotonic() + timeout
        while not probe_model("127.0.0.1", port, timeout=5.0).up:
            if time.monotonic() > deadline or not earlier.alive():
                raise TestbedError(f"the earlier run never answered:\n{earlier.output()[-2000:]}")
            time.sleep(0.2)
        seed_crash(cluster, port)
        orphan = sim.wait_for_orphan(peer, timeout=60)
        deadline = time.monotonic() + sim.config.killable_for + 30
        while orphan.host_pid is None or processes.state(orphan.host_pid) != "D":
            if time.monotonic() > deadline:
                raise TestbedError(f"the earlier run's rank on {peer} never froze")
            time.sleep(0.1)
        return orphan.host_pid
    finally:
        with contextlib.suppress(Exception):
            earlier.close()


__all__ = ["frozen_survivor", "launchers", "model_ranks", "seed_crash"]
