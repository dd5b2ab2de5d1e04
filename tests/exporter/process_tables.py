"""Synthetic process tables and fake /proc trees for process-model tests."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.processes.info import ProcessInfo, State
from mlx_medic.processes.roles import classify, resolve_exo_runners

PYTHON = "/opt/mlx/venv/bin/python3"
MODEL_PATH = "mlx-community/GLM-4.6-5bit"

# The seed's cluster in small: glm on ai001 (head) and ai002, qwq on ai002 only.
INVENTORY = parse_inventory(
    f"""
nodes:
  ai001: {{ssh: 192.168.101.1}}
  ai002: {{ssh: 192.168.101.2}}
  ai003: {{ssh: 192.168.101.3}}
models:
  glm:
    model: {MODEL_PATH}
    nodes: [ai001, ai002]
    port: 8080
    service: {{manager: launchd, label: com.example.glm}}
    backends: {{ring: {{hostfile: /etc/mlx-medic/glm.ring.json}}}}
    tmp_dirs: [/Users/ai/.cache/mlx-share/glm]
  qwq:
    model: mlx-community/QwQ-32B-8bit
    nodes: [ai002]
    port: 8081
    service: {{manager: launchd, label: com.example.qwq}}
    backends: {{ring: {{hostfile: /etc/mlx-medic/qwq.ring.json}}}}
"""
)

SSHD_LISTENER = ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"]
SSHD_SESSION = ["sshd: ai@ttys000"]


def proc(
    pid: int,
    ppid: int,
    cmdline: Sequence[str] | str,
    *,
    env: Mapping[str, str] | None = None,
    state: State = State.SLEEPING,
    created: float = 1000.0,
    name: str = "",
) -> ProcessInfo:
    """A process whose role is classified exactly as a real table would."""
    argv = tuple(shlex.split(cmdline) if isinstance(cmdline, str) else cmdline)
    environment = dict(env or {})
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        state=state,
        cmdline=argv,
        create_time=created,
        name=name or (Path(argv[0]).name[:15] if argv else ""),
        role=classify(argv, lambda: environment),
        env_loader=lambda: environment,
    )


def rank_argv(port: int = 8080, model: str = MODEL_PATH) -> list[str]:
    return [PYTHON, "-m", "mlx_lm.server", "--model", model, "--port", str(port)]


def launch_script(
    rank: int,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    hostfile: str = '[["10.0.0.1:32323"]]',
) -> str:
    """The script mlx.launch's RemoteProcess.make_launch_script builds (ring backend)."""
    script = "stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; "
    script += 'printf "%s\\n" $pidfile; if [[ -d /srv ]]; then   cd /srv; fi; '
    for key, value in (env or {}).items():
        script += f"export {key}={shlex.quote(value)}; "
    script += f"fname=$(mktemp); echo {shlex.quote(hostfile)} >$fname; export MLX_HOSTFILE=$fname; "
    script += f"export MLX_RANK={rank}; "
    script += f"cmd=({' '.join(map(shlex.quote, argv))}); "
    script += 'exec "${cmd[@]}"'
    return script


def ssh_client_argv(
    host: str, rank: int, argv: Sequence[str], env=None, hostfile: str = '[["10.0.0.1:32323"]]'
) -> list[str]:
    return ["ssh", "-tt", "-o", "LogLevel=QUIET", host, launch_script(rank, argv, env, hostfile)]


# glm's ring placement as mlx.launch writes it (launch_ring: json.dumps of each rank's
# ip:port list, then `echo ... >$fname` adds a newline).
GLM_RING = '[["192.168.101.1:32323"], ["192.168.101.2:32324"]]\n'


def launched_env(rank: int, hostfile_path: str, **extra: str) -> dict[str, str]:
    """What mlx.launch's ring script exports to a rank: MLX_HOSTFILE (a mktemp path) and
    MLX_RANK, after any --env."""
    return {**extra, "MLX_HOSTFILE": hostfile_path, "MLX_RANK": str(rank)}


def launcher_argv(argv: Sequence[str]) -> list[str]:
    return [
        PYTHON,
        "/opt/mlx/venv/bin/mlx.launch",
        "--backend",
        "ring",
        "--hostfile",
        "/etc/mlx-medic/ring.json",
        "--",
        *argv,
    ]


def table(*processes: ProcessInfo) -> list[ProcessInfo]:
    listed = list(processes)
    resolve_exo_runners({p.pid: p for p in listed})
    return listed


class FakeProc:
    """A fake /proc tree: enough of stat, cmdline and environ for LinuxProcessTable."""

    def __init__(self, root: Path, btime: int = 1_700_000_000):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")
        (root / "self").mkdir(exist_ok=True)  # non-numeric entries are skipped

    def add(
        self,
        pid: int,
        ppid: int,
        argv: Sequence[str] | bytes,
        *,
        state: str = "S",
        comm: str | None = None,
        env: Mapping[str, str] | None = None,
        starttime: int = 100,
    ) -> Path:
        directory = self.root / str(pid)
        directory.mkdir()
        raw = argv if isinstance(argv, bytes) else b"".join(a.encode() + b"\0" for a in argv)
        (directory / "cmdline").write_bytes(raw)
        name = (
            comm
            if comm is not None
            else (Path(argv[0]).name[:15] if argv and not isinstance(argv, bytes) else "x")
        )
        rest = " ".join(["0"] * 17)
        # fields after comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt
        # cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime
        (directory / "stat").write_text(f"{pid} ({name}) {state} {ppid} {rest} {starttime} 0 0\n")
        environ = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items())
        (directory / "environ").write_bytes(environ)
        return directory
