"""A model's service as launchd KeepAlive runs it, on a testbed node: supervisord inside the
node's namespaces restarts the program whenever it exits, behind `testbed.throttle` (at
most one spawn per `throttle` seconds, as launchd's ThrottleInterval).

    with keep_alive(cluster.head, ["bash", "start.sh"], workdir=DIR, throttle=3.0) as svc:
        svc.ctl("status")
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from testbed.closing import ClosedOnExit
from testbed.cluster import SimNode

REPO = Path(__file__).resolve().parents[1]

# supervisord's own sections, its socket and files in the node's private /tmp
CONTROL = """\
[unix_http_server]
file=/tmp/supervisor-{token}.sock
[supervisord]
pidfile=/tmp/supervisord-{token}.pid
logfile=/tmp/supervisord-{token}.log
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix:///tmp/supervisor-{token}.sock
"""
CONF = (
    CONTROL
    + """\
[program:{program}]
command={command}
environment={environment}
directory={directory}
autorestart=true
startsecs=0
startretries=1000000
stopsignal=TERM
stopwaitsecs={stopwaitsecs}
redirect_stderr=true
stdout_logfile={log}
stdout_logfile_maxbytes=0
"""
)


@dataclass
class KeepAlive(ClosedOnExit):
    node: SimNode
    program: str
    conf: Path
    log: Path
    daemon: subprocess.Popen[bytes]

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """supervisorctl inside the node (through its sshd, as a person would)."""
        return self.node.run(
            shlex.join(["supervisorctl", "-c", str(self.conf), *args]), timeout=timeout, check=False
        )

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the program (its own SIGTERM handling first), then supervisord."""
        if self.daemon.poll() is None:
            with contextlib.suppress(Exception):
                self.ctl("stop", self.program)
            self.daemon.kill()  # the host-side nsenter; what ran in the node is the node's
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.daemon.wait(timeout=10)


def keep_alive(
    node: SimNode,
    command: list[str],
    *,
    workdir: Path,
    throttle: float,
    env: dict[str, str],
    stopwaitsecs: float = 60.0,
    name: str | None = None,
    user: str | None = None,
    output_dir: Path | None = None,
) -> KeepAlive:
    """Start supervisord in `node` running `command` as a KeepAlive service (as `user`,
    supervisord's `user=`, when given). The config goes to `workdir`; the program's log
    and the throttle's stamp, which the program writes, to `output_dir` (default
    `workdir`)."""
    token = name or f"svc-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    output_dir = output_dir or workdir
    conf, log = workdir / f"{token}.conf", output_dir / f"{token}.log"
    throttled = [
        sys.executable,
        "-m",
        "testbed.throttle",
        "--every",
        f"{throttle:g}",
        "--stamp",
        str(output_dir / f"{token}.stamp"),
        "--",
        *command,
    ]
    environment = ",".join(
        f'{key}="{value}"'
        for key, value in {**env, "PYTHONPATH": str(REPO)}.items()
        if key in ("PATH", "HF_HUB_OFFLINE", "PYTHONPATH")
    )
    conf.write_text(
        CONF.format(
            token=token,
            program=token,
            command=shlex.join(throttled),
            environment=environment,
            directory=workdir,
            stopwaitsecs=int(stopwaitsecs),
            log=log,
        )
        + (f"user={user}\n" if user else "")
    )
    daemon = node.spawn(
        ["supervisord", "-n", "-c", str(conf)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return KeepAlive(node, token, conf, log, daemon)
