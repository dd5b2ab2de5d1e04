"""How the remediator connects to a node over SSH, said once: the options `SshTransport`
gives asyncssh, and the OpenSSH command line that connects the same way, for a person to
check a node as the remediator reaches it (an `unreachable` run's next action).

No asyncssh here: the runner spells the command line without loading it.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from mlx_medic.inventory.schema import Node, SshSettings


def asyncssh_options(node: Node, settings: SshSettings) -> dict[str, Any]:
    """asyncssh.connect's keywords: no ~/.ssh/config (the inventory alone decides where a
    node is), host keys always checked (`known_hosts`, else ~/.ssh/known_hosts), the
    inventory's key beside the agent's."""
    options: dict[str, Any] = {
        "host": node.ssh,
        "port": node.port,
        "username": node.user,
        "config": None,
        "connect_timeout": settings.connect_timeout,
        "keepalive_interval": 30,
    }
    if settings.known_hosts is not None:
        options["known_hosts"] = str(settings.known_hosts)
    if settings.identity_file is not None:
        options["client_keys"] = [str(settings.identity_file)]
    return options


def ssh_command_line(node: Node, settings: SshSettings, *argv: str) -> str:
    """`ssh ... USER@HOST ARGV` as asyncssh_options connects: no config file (`-F none`),
    the same key and known_hosts, an unknown or changed host key refused, no prompt."""
    line = ["ssh", "-F", "none"]
    if settings.identity_file is not None:
        line += ["-i", str(settings.identity_file)]
    if settings.known_hosts is not None:
        line += ["-o", f"UserKnownHostsFile={settings.known_hosts}"]
    line += [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={math.ceil(settings.connect_timeout)}",
        "-p",
        str(node.port),
        f"{node.user}@{node.ssh}",
        *argv,
    ]
    return shlex.join(line)
