"""The inventory: one YAML file that describes the cluster.

The exporter and the remediator read the same file. Loading it
(`mlx_medic.inventory.load`) validates it completely; every error names the field, its
line, and what is wrong, so a bad file never half-configures a node. This module holds
the whole file (`Inventory`) and its node, SSH and signature sections; a served model's
section is `mlx_medic.inventory.model`, the field types `mlx_medic.inventory.fields`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from mlx_medic.inventory.fields import (
    DEFAULT_LOGIN_USER,
    USER_NAME_PATTERN,
    AbsolutePath,
    Duration,
    Name,
    SshSource,
    StrictModel,
)
from mlx_medic.inventory.methods import InventoryMethods
from mlx_medic.inventory.model import Model
from mlx_medic.state.layout import DEFAULT_STATE_DIR

_REBOOT_WORD = re.compile(r"[A-Za-z0-9._/:+@=,~-]{1,256}")


class Reboot(StrictModel):
    """Whether the remediator may reboot this node itself (issue 29's guarded reboot,
    docs/drain.md): only when survivors of SIGKILL there hold protection domains a model
    needs and every guard holds; the node's login user runs `command` through `sudo -n`,
    the one rule `mlx-medic render sudoers` writes for it."""

    allowed: bool = Field(
        default=False,
        description="the remediator may reboot this node itself (the `reboot-node` run of"
        " MLXUnkillableSurvivors, when its guards hold: docs/drain.md), and `mlx-medic render"
        " sudoers` writes the one rule that lets the node's login user run `command` through"
        " `sudo -n`; false: no reboot by mlx-medic (`mlx-medic drain`, a person's reboot,"
        " `mlx-medic undrain`) and no reboot rule",
    )
    min_uptime: Duration = Field(
        default=3600.0,
        description="the remediator never reboots the node within this long of its last boot"
        " (the `booted-recently` guard)",
    )
    boot_timeout: Duration = Field(
        default=900.0,
        gt=0,
        description="how long the remediator's reboot waits for the node to answer with a new"
        " boot id before it escalates",
    )
    command: list[str] = Field(
        default_factory=lambda: ["/sbin/shutdown", "-r", "now"],
        min_length=1,
        description="the reboot command's argument list, run as `sudo -n COMMAND...` by the"
        " node's login user: an absolute path, then literal words (no spaces, wildcards or"
        " quotes), exactly as the sudoers rule names them",
    )

    @field_validator("command")
    @classmethod
    def _literal_words(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("/") or ".." in value[0].split("/"):
            raise ValueError(f"{value[0]!r}: the command must be an absolute path without '..'")
        for word in value:
            if not _REBOOT_WORD.fullmatch(word):
                raise ValueError(
                    f"{word!r} cannot be one literal word of a sudoers rule (letters, digits,"
                    " '._/:+@=,~-'; no spaces, wildcards or quotes)"
                )
        return value


class Node(StrictModel):
    """A machine in the cluster, reached over SSH."""

    name: Name = Field(
        description="the node's name, the mapping key; `models.<name>.nodes` and `--node`"
        " refer to it"
    )
    ssh: str = Field(description="address or host name used by ssh and in hostfiles")
    user: str = Field(
        default=DEFAULT_LOGIN_USER,
        pattern=USER_NAME_PATTERN,
        description="the SSH login user on this node: the remediator and the serve wrapper log"
        " in as it, each key pinned to what its user sends (`mlx-medic render"
        " authorized-keys`); default: `ssh.user`",
    )
    port: int = Field(default=22, ge=1, le=65535, description="SSH port")
    medic_command: str = Field(
        default="mlx-medic",
        description="the mlx-medic command on this node as the remediator runs it over SSH;"
        " use an absolute path (sshd's PATH is minimal; `mlx-medic render` requires one)",
    )

    source_addresses: list[SshSource] = Field(
        default_factory=list,
        description="where this node's own SSH logins to the other nodes come from (the"
        " serve wrapper on a model's head): the `from=` of the wrapper's key on its peers"
        " (`mlx-medic render authorized-keys`); empty: `ssh`",
    )
    medic_config: AbsolutePath = Field(
        default=Path("/etc/mlx-medic/inventory.yaml"),
        description="this inventory's path on the node: the node helpers the remediator and"
        " the serve wrapper run there read it (`mlx-medic node HELPER --inventory`)",
    )
    reboot: Reboot = Field(
        default_factory=Reboot,
        description="whether the node's login user may run its reboot command through sudo"
        " (off by default), and that command",
    )

    @field_validator("ssh")
    @classmethod
    def _ssh_is_host(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9.:_-]{1,253}", value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a host name or IP address")
        return value

    @field_validator("medic_command")
    @classmethod
    def _medic_command_is_one_word(cls, value: str) -> str:
        # One argv word, quoted over SSH: no shell ever sees it, so `~` is never expanded.
        if value.startswith("-"):
            raise ValueError(f"{value!r} starts with '-': it would read as an option")
        if value.startswith("~"):
            raise ValueError(f"{value!r}: '~' is never expanded here; write the full path")
        if not re.fullmatch(r"[A-Za-z0-9._/+@=,:-]{1,1024}", value):
            raise ValueError(
                f"{value!r} is not a command name or path (one word: letters, digits, '._/+@=,:-';"
                " no spaces)"
            )
        return value


class Signature(StrictModel):
    """An error text to count in service logs; a regular expression."""

    name: Name = Field(
        description="the `signature` label of mlx_log_errors_total, present from 0 in every"
        " log file (for alerts); a built-in's name replaces it"
    )
    pattern: str = Field(description="a Python regular expression searched in each log line")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class SshSettings(StrictModel):
    """How the remediator reaches nodes. Host keys are always checked."""

    user: str = Field(
        default=DEFAULT_LOGIN_USER,
        pattern=USER_NAME_PATTERN,
        description="the SSH login user on every node (a node's own `user` overrides it): a"
        " dedicated user, not root (`check-config` refuses root unless `allow_root_login`)",
    )
    allow_root_login: bool = Field(
        default=False,
        description="let a node's login user be root (`check-config` refuses it otherwise):"
        " the keys' forced command then runs the helpers as root",
    )
    remediator_addresses: list[SshSource] = Field(
        default_factory=list,
        description="where the remediator's replicas log in from: IP addresses, networks"
        " (CIDR) or host names (sshd matches names only with `UseDNS yes`). `mlx-medic render"
        " authorized-keys` writes them as the remediator key's `from=` and refuses to render"
        " without them",
    )

    identity_file: Path | None = Field(
        default=None, description="the private key to log in with; null: ssh's own default keys"
    )
    known_hosts: Path | None = Field(
        default=None,
        description="the known_hosts file host keys are checked against; null: ~/.ssh/known_hosts",
    )
    connect_timeout: Duration = Field(default=10.0, description="time to open an SSH connection")
    command_timeout: Duration = Field(
        default=120.0,
        description="a node helper call's time to answer (a sweep's: this plus the model's"
        ' `kill_grace`); past it the call "timed out" and the run escalates naming the'
        " node, the helper and this limit. The helper is sent the same limit"
        " (`--time-limit`) and ends itself and what it started on the node once it passed"
        " (sshd signals no command without a terminal, so the call's end alone would leave"
        " it running). A playbook step may run for the longer of this and the model's"
        " `start_timeout`, plus 60 s, before it counts as failed",
    )
    helper_sessions: bool = Field(
        default=True,
        description="run the helper calls to a node through one helper session per node and"
        " connection (`mlx-medic node session`: a child forked per call, about a tenth of"
        " a helper's CPU on the node); a node that opens none gets a process per call."
        " false: a process per call always",
    )


class Inventory(StrictModel, InventoryMethods[Node, Model]):
    """The whole file."""

    nodes: list[Node] = Field(
        description="the machines, keyed by node name (or a list of entries with `name`)"
    )
    ssh: SshSettings = Field(
        default_factory=SshSettings, description="how the remediator reaches the nodes"
    )
    models: list[Model] = Field(
        default_factory=list,
        description="the served models, keyed by model name (or a list of entries with `name`)",
    )
    signatures: list[Signature] = Field(
        default_factory=list, description="extra log signatures, added to the built-in set"
    )
    state_dir: Path = Field(
        default=DEFAULT_STATE_DIR,
        description="on every node: the node-id file, current run ids (`runs/`), probe locks"
        " (`locks/`) and log read positions",
    )
    launch_temp_dirs: list[Path] = Field(
        default_factory=list,
        description="where mlx.launch's mktemp files land, for every model on every node;"
        " empty: each model's `service.user`'s temp dir",
    )

    @model_validator(mode="before")
    @classmethod
    def _login_user(cls, data: Any) -> Any:
        """A node without its own `user` logs in as `ssh.user` (when that is a user name:
        a bad one is reported once, at ssh.user)."""
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            return data
        ssh = data.get("ssh")
        user = ssh.get("user", DEFAULT_LOGIN_USER) if isinstance(ssh, dict) else None
        if not isinstance(user, str) or not re.match(USER_NAME_PATTERN, user):
            return data
        nodes = [
            {"user": user, **node} if isinstance(node, dict) else node for node in data["nodes"]
        ]
        return {**data, "nodes": nodes}

    @model_validator(mode="after")
    def _consistent(self) -> Inventory:
        names = [n.name for n in self.nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique; repeated: {duplicates}")
        addresses = [(n.ssh, n.port) for n in self.nodes]
        for node in self.nodes:
            if addresses.count((node.ssh, node.port)) > 1:
                raise ValueError(f"nodes share the ssh address {node.ssh}:{node.port}")
        model_names = [m.name for m in self.models]
        repeated = sorted({m for m in model_names if model_names.count(m) > 1})
        if repeated:
            raise ValueError(f"model names must be unique; repeated: {repeated}")
        known = set(names)
        ports: dict[tuple[str, int], str] = {}
        for model in self.models:
            for node_name in model.nodes:
                if node_name not in known:
                    raise ValueError(
                        f"model {model.name!r} places a rank on unknown node {node_name!r};"
                        f" known nodes: {sorted(known)}"
                    )
            key = (model.head, model.port)
            if key in ports:
                raise ValueError(
                    f"models {ports[key]!r} and {model.name!r} both serve on"
                    f" {model.head}:{model.port}"
                )
            ports[key] = model.name
        return self
