"""Real `mlx.launch` inside the head node, so its death leaves the seed's orphans.

The launcher runs inside the head node's namespaces (nsenter, no ssh), with the testbed's
`ssh` wrapper first on PATH. Rank 0 is its local child (`127.0.0.1` in the hostfile);
peers are started through `ssh -tt <peer>`, so on a peer a rank's parent is its
`sshd: root@pts/N` session. SIGKILL the launcher (`LaunchHandle.kill()`) and the peer
rank keeps that sshd parent (ppid != 1), while on the head the local rank and the
`ssh -tt` clients are adopted by the node's pid 1.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed import node_users, processes
from testbed.closing import ClosedOnExit
from testbed.cluster import Cluster, SimNode, TestbedError


def mlx_launch_path() -> str:
    """mlx.launch of this Python (a venv's bin dir or pyenv's version dir), not a shim."""
    candidate = Path(sys.executable).parent / "mlx.launch"
    if not candidate.exists():
        raise TestbedError(f"{candidate} not found: install mlx in this Python")
    return str(candidate)


@dataclass
class LaunchHandle(ClosedOnExit):
    """A running mlx.launch. `launcher_pid` is its host pid; `popen` is the host-side nsenter."""

    popen: subprocess.Popen[bytes]
    launcher_pid: int
    head: SimNode
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def launcher_ns_pid(self) -> int:
        return self.head.ns_pid_of(self.launcher_pid)

    def alive(self) -> bool:
        return processes.is_alive(self.launcher_pid)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the mlx.launch process itself (by pid), as a crash or `kill -9` would."""
        processes.kill_quietly(self.launcher_pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        """Everything mlx.launch printed so far (its ranks' stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_output(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            out = self.output()
            if text in out:
                return out
            if self.popen.poll() is not None:
                raise TestbedError(
                    f"mlx.launch exited {self.popen.returncode} before printing {text!r}:\n{out}"
                )
            if time.monotonic() >= deadline:
                raise TestbedError(f"mlx.launch did not print {text!r} in {timeout:.0f}s:\n{out}")
            time.sleep(0.1)

    def close(self) -> None:
        """End the launcher if it still runs. Ranks it left are the nodes' cleanup's job."""
        if self.alive():
            self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)


def start_launch(
    cluster: Cluster,
    hostfile: Path,
    argv: list[str],
    env: dict[str, str] | None = None,
    head: str | None = None,
    backend: str = "ring",
    launch_args: list[str] | None = None,
    log_path: Path | None = None,
) -> LaunchHandle:
    """Run `mlx.launch --hostfile HOSTFILE --backend BACKEND [launch_args] -- ARGV` in the head.

    `argv` is the rank command; use absolute paths outside /tmp (e.g. `cluster.python`),
    since peers run it through ssh with sshd's default PATH. `env` defaults to
    `cluster.env()`. Output goes to `log_path` (default under the workdir).
    """
    head_node = cluster.node(head) if head else cluster.head
    if log_path is None:
        logs = cluster.workdir / "launch-logs"
        logs.mkdir(exist_ok=True)
        log_path = logs / f"launch-{time.time_ns()}.log"
    command = [
        *node_users.run_as(cluster.node_user),  # the service's user, in the three-user mode
        mlx_launch_path(),
        "--hostfile",
        str(hostfile),
        "--backend",
        backend,
        *(launch_args or []),
        "--",
        *argv,
    ]
    with log_path.open("ab") as log:
        popen = head_node.spawn(
            command,
            env=env if env is not None else cluster.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(cluster.workdir),
        )
    try:
        launcher = head_node.spawned_pid(popen)
    except BaseException:
        popen.kill()
        popen.wait()
        raise
    return LaunchHandle(popen, launcher, head_node, log_path, command)


def rank_pids(node: SimNode, needle: str) -> list[int]:
    """Host pids of the node's processes running with MLX_RANK set whose argv has `needle`."""
    found = []
    for pid in node.find_pids(needle):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"\0MLX_RANK=" in b"\0" + environ:
            found.append(pid)
    return found


__all__ = ["LaunchHandle", "mlx_launch_path", "rank_pids", "start_launch"]
