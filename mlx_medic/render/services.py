"""What every service file says the same way, whichever manager runs it: the commands,
the user, TMPDIR, the log files and how long a stop may take.

launchd, systemd and supervisord files for one model are rendered from these, so they
cannot drift apart.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from mlx_medic.inventory.model import Model, ServiceManager
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.render.files import RenderError

EXPORTER_PORT = 10900  # the exporter's default --web.listen-address port
EXPORTER_LABEL = "com.mlx-medic.exporter"
REMEDIATOR_LABEL = "com.mlx-medic.remediator"
# A service manager's SIGKILL comes this long after the wrapper's own teardown bound
# (policy.stop_timeout), so the wrapper always gets to end its ranks itself first.
STOP_MARGIN_SECONDS = 30
THROTTLE_SECONDS = 10  # launchd's default respawn throttle, said explicitly
# Every log file a rendered service writes is rotated past this size, this many kept
# (newsyslog for launchd jobs, supervisord itself for its programs).
ROTATE_AT_MIB = 100
ARCHIVES_KEPT = 7


def medic_command(node: Node) -> str:
    """The node's mlx-medic as a service runs it: an absolute path, since launchd and
    systemd search no PATH the way a shell does."""
    if not node.medic_command.startswith("/"):
        raise RenderError(
            f"nodes.{node.name}.medic_command: {node.medic_command!r} is not an absolute"
            " path; a service file needs the full path of mlx-medic on the node"
        )
    return node.medic_command


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def exporter_listen(node: Node) -> str:
    """The node's inventory address (what Prometheus scrapes), not every interface."""
    return host_port(node.ssh, EXPORTER_PORT)


def log_file_flag(log_file: str | None) -> list[str]:
    """`--log.file FILE` for a job whose log no journal keeps: the process appends to it
    and reopens it once rotated (mlx_medic.logs), so a rotation needs no signal."""
    return ["--log.file", log_file] if log_file else []


def exporter_argv(node: Node, log_file: str | None = None) -> list[str]:
    return [
        medic_command(node),
        "exporter",
        "--inventory",
        str(node.medic_config),
        "--node",
        node.name,
        "--web.listen-address",
        exporter_listen(node),
        *log_file_flag(log_file),
    ]


def serve_argv(inventory: Inventory, model: Model) -> list[str]:
    """The serve wrapper on the model's head, reading the inventory at the head's path."""
    head = inventory.node(model.head)
    return [medic_command(head), "serve", model.name, "--inventory", str(head.medic_config)]


def remediator_argv(command: str, log_file: str | None = None) -> list[str]:
    """No --config.file: the job sets MLX_MEDIC_CONFIG (remediator_environment), so the
    remediator and the on-call commands on its host find one config the same way."""
    return [command, "remediator", *log_file_flag(log_file)]


def remediator_environment(config: str) -> dict[str, str]:
    return {"MLX_MEDIC_CONFIG": config, "PYTHONUNBUFFERED": "1"}


def wrapper_models(inventory: Inventory, manager: ServiceManager) -> list[Model]:
    """Models whose service this manager runs and which run the serve wrapper (a `script`
    service is the site's own file)."""
    return [
        m for m in inventory.models if m.service.manager == manager and m.service.kind == "wrapper"
    ]


def stop_bound(model: Model) -> int:
    """Seconds a service manager waits after SIGTERM before SIGKILL: longer than the
    wrapper's own teardown (policy.stop_timeout)."""
    return math.ceil(model.policy.stop_timeout) + STOP_MARGIN_SECONDS


def log_paths(model: Model) -> tuple[str, str]:
    """(stdout, stderr): the first of `log_files` takes stderr (where Python's tracebacks
    and the JACCL errors go), the second stdout; with one, both go to it."""
    logs = [str(p) for p in model.log_files]
    if not logs:
        raise RenderError(
            f"models.{model.name}.log_files: empty; the service's output must go to the files"
            " the logs collector reads"
        )
    return (logs[1] if len(logs) > 1 else logs[0]), logs[0]


def tmpdir(model: Model) -> str:
    """The service's TMPDIR: the model's first `tmp_dirs` entry, where the staleness rule
    counts and the playbook cleans what Python's tempfile leaves; a launchd daemon may
    otherwise get none and leave it in /tmp, where nothing looks."""
    if not model.tmp_dirs:
        raise RenderError(
            f"models.{model.name}.tmp_dirs: empty; the service's TMPDIR is the first of them"
        )
    return str(model.tmp_dirs[0])


def environment(model: Model) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", "TMPDIR": tmpdir(model)}


def unit_name(label: str) -> str:
    """A systemd label as a unit file name (systemctl adds `.service` to a bare name too)."""
    return label if label.endswith(".service") else f"{label}.service"


def head_dir(target: str, model: Model) -> PurePosixPath:
    return PurePosixPath(target) / model.head
