"""The inventory: one YAML file that describes the cluster.

The exporter and the remediator read the same file. Loading it validates it
completely; every error names the field, its line, and what is wrong, so a bad
file never half-configures a node.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mlx_medic.inventory_methods import (
    BackendsMethods,
    InventoryError,
    InventoryMethods,
    ModelMethods,
    ProcessPatternsMethods,
    ServiceMethods,
)
from mlx_medic.names import NAME_PATTERN
from mlx_medic.state_layout import DEFAULT_STATE_DIR

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
USER_NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
DEFAULT_LOGIN_USER = "mlx-medic"  # a named user of its own, never root by default
ServiceManager = Literal["launchd", "systemd", "supervisord"]
ServiceKind = Literal["wrapper", "script"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from `90`, `90s`, `15m`, `2h` or `1d`."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ValueError(f"{value!r} is not a duration; use seconds or e.g. '90s', '15m', '2h'")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


# Seconds; the file may say `90`, `90s`, `15m`, `2h` or `1d`. The parser rides on the type,
# so every duration field accepts the same spellings and the reference can name the type.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


def _absolute_path(value: Path) -> Path:
    if not value.is_absolute() or ".." in value.parts:
        raise ValueError(f"{str(value)!r} must be an absolute path without '..'")
    return value


# A file the inventory names on a node (its own copy, a plist, an interpreter, a key).
AbsolutePath = Annotated[Path, AfterValidator(_absolute_path)]


class StrictModel(BaseModel):
    """A config section that refuses unknown keys (a typo is an error, never ignored) and
    never changes once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def _ssh_source(value: str) -> str:
    """An address sshd's `from=` matches: an IP, a network (CIDR) or a host name."""
    try:
        return str(
            ipaddress.ip_network(value, strict=True)
            if "/" in value
            else ipaddress.ip_address(value)
        )
    except ValueError as exc:
        if "/" in value or re.fullmatch(r"[0-9.]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*", value):
            raise ValueError(f"{value!r} is not an IP address or network: {exc}") from None
    if not _HOST_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an IP address, a network (CIDR) or a host name (no wildcards)"
        )
    return value


SshSource = Annotated[str, AfterValidator(_ssh_source)]


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
        " the serve wrapper run there read it (`mlx-medic node HELPER --config.file`)",
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


class Service(StrictModel, ServiceMethods):
    """How the head node keeps the model running (launchd KeepAlive in production)."""

    manager: ServiceManager = Field(
        description="what keeps the model's server running on the head node; the remediator's"
        " playbooks stop and start it with the manager's command (launchctl, systemctl,"
        " supervisorctl)"
    )
    label: str = Field(
        pattern=r"^[A-Za-z0-9._:-]{1,200}$",
        description="the service's name for its manager (launchd: the job label; systemd:"
        " the unit; supervisord: the program)",
    )
    kind: ServiceKind = Field(
        default="wrapper",
        description="what the service runs: `wrapper` (`mlx-medic serve MODEL`, which sweeps,"
        " chooses the backend and launches) or `script` (the site's own start script, as in"
        " the seed: it runs mlx.launch itself)",
    )
    plist: AbsolutePath | None = Field(
        default=None,
        description="launchd: the job's plist, which `sudo -n /bin/launchctl bootstrap` loads"
        " again after a stop; null: /Library/LaunchDaemons/<label>.plist",
    )
    config: AbsolutePath | None = Field(
        default=None,
        description="supervisord: the supervisord.conf that supervisorctl reads (`-c`);"
        " null: supervisorctl's own default",
    )
    sudo: bool = Field(
        default=False,
        description="supervisord: run supervisorctl as `sudo -n /usr/bin/supervisorctl ...`"
        " (a root-only supervisord socket; `mlx-medic render sudoers` writes the rule); false:"
        " plain `supervisorctl`, the socket's permissions decide. launchctl and systemctl"
        " always go through sudo",
    )

    user: str | None = Field(
        default=None,
        pattern=USER_NAME_PATTERN,
        description="the user the service runs as (launchd: the plist's `UserName`)."
        " mlx.launch's pid files and hostfiles land in this user's temp dir on every node of"
        " the model (ssh logs in to the peers under the same name by default), and the"
        " exporter counts leftovers there (macOS: the user's `DARWIN_USER_TEMP_DIR`, asked as"
        " that user; Linux: /tmp); null: the user the exporter runs as",
    )


class Backend(StrictModel):
    """One way to start the model's ranks."""

    hostfile: Path = Field(description="the mlx.launch hostfile for this backend")
    pipeline: bool = Field(default=False, description="pass --pipeline to mlx_lm.server")


class RingBackend(Backend):
    """The ring fallback, as seed 004 runs it: pipeline split by default (tensor parallel
    sends many small messages per token, which ring over TCP does slowly)."""

    pipeline: bool = Field(
        default=True,
        description="pass --pipeline to mlx_lm.server (seed 004: ring with pipeline split);"
        " false for a model whose architecture cannot pipeline (mlx_lm.server then says"
        ' "The model does not support pipelining")',
    )


class Backends(StrictModel, BackendsMethods[Backend]):
    """Backends in order of preference: JACCL first, ring as the fallback."""

    jaccl: Backend | None = Field(
        default=None, description="JACCL over RDMA (Thunderbolt 5); tried first"
    )
    ring: RingBackend | None = Field(
        default=None, description="the ring backend over TCP; the fallback when JACCL fails"
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> Backends:
        if self.jaccl is None and self.ring is None:
            raise ValueError("name at least one backend (jaccl or ring) with its hostfile")
        return self


class Policy(StrictModel):
    """Limits on automatic action, so a restart loop cannot spend the PD budget."""

    restart_budget: int = Field(
        default=3,
        ge=0,
        le=100,
        description="automatic runs allowed per `window`; when spent, the model's circuit"
        " opens and on-call is told",
    )
    window: Duration = Field(default=3600.0, description="the span `restart_budget` counts over")
    backoff: Duration = Field(
        default=30.0,
        description="the wait after the first counted run in the window; it doubles with each"
        " further run",
    )
    start_timeout: Duration = Field(
        default=600.0,
        description="the time a start gets to answer the health probe (the playbook's verify"
        " step); also bounds a step's run time, with `ssh.command_timeout`",
    )
    pd_reserve: int = Field(
        default=5,
        ge=0,
        le=11,
        description="no JACCL start is tried on a node where a device the start needs (its"
        " row of the JACCL hostfile) has spent this many protection domains since the boot,"
        " by the node's ledger (of about 11 per RDMA device; a SIGKILLed, vanished or"
        " unkillable JACCL rank spends one on each of its devices until reboot, a failed"
        " allocation spends nothing). 5 after dryvist/nix-ai's cap of 5 of 11, which keeps"
        " domains for a person to recover with; 0: never JACCL",
    )
    kill_grace: Duration = Field(
        default=10.0,
        description="a sweep's wait between SIGTERM and SIGKILL, for a rank to end itself",
    )
    dead_launch_grace: Duration = Field(
        default=0.25,
        description="the serve wrapper's wait between SIGTERM and SIGKILL for the ranks of a"
        " launch whose mlx.launch is gone (its start sweep, its teardown after a crash), at"
        " most kill_grace: an orphan stuck in the RDMA driver ignores SIGTERM and may turn"
        " unkillable while it is waited for (docs/decisions.md)",
    )
    sigkill: bool = Field(
        default=True,
        description="whether a sweep may SIGKILL what SIGTERM left (a SIGKILLed JACCL rank"
        " spends a protection domain until reboot, which the ledger counts); false: survivors"
        " of SIGTERM are reported, never killed",
    )
    stop_timeout: Duration = Field(
        default=60.0,
        description="the serve wrapper ends every rank of its run within this after SIGTERM;"
        " rendered service files wait longer before their own SIGKILL",
    )
    stale_tmp_age: Duration = Field(
        default=600.0,
        description="a `tmp*` entry in `tmp_dirs`/`cache_dirs` unchanged this long, and used by"
        " no live process, is stale; in a dir other models on the node also name, only once"
        " it is older than every one of their ages",
    )


class ServeSettings(StrictModel):
    """How `mlx-medic serve` starts the model's ranks and keeps them tied to itself."""

    python: AbsolutePath | None = Field(
        default=None,
        description="the interpreter the ranks start with on every node (`mlx.launch"
        " --python`: one path for all hosts, so keep MLX and mlx-medic in a venv at the same"
        " path on each node; the rank guard runs in it too); null: the interpreter that runs"
        " `mlx-medic serve`",
    )
    starting_port: int | None = Field(
        default=None,
        ge=1024,
        le=65000,
        description="`mlx.launch --starting-port` for this model's ring (and its smoke test):"
        " two models on one node need ranges of their own; null: mlx.launch's default,"
        " which only one model per node may use",
    )
    smoke_timeout: Duration = Field(
        default=60.0,
        description="the time limit of the smoke test (a short all-reduce over every rank"
        " through mlx.launch); past it the test has failed and its ranks are ended",
    )
    lease: Duration = Field(
        default=10.0,
        description="the run's lease on each node, renewed by the wrapper every quarter of it;"
        " a guard beside each rank ends it once the lease runs out, so after a SIGKILLed"
        " wrapper no rank lives much longer than this",
    )

    relaunch_limit: int = Field(
        default=5,
        ge=0,
        le=100,
        description="after a crash (or a start whose backends all failed) the wrapper ends"
        " what is left and launches again itself, up to this many times per"
        " relaunch_window, instead of exiting into the service manager's restart throttle"
        " (launchd: 10s); then it exits 1 and the service manager restarts it. 0: exit at"
        " once",
    )
    relaunch_window: Duration = Field(
        default=600.0,
        description="the span relaunch_limit counts over",
    )
    relaunch_interval: Duration = Field(
        default=10.0,
        description="two launches of the model (a relaunch's and the one before it) start at"
        " least this far apart, as launchd's default ThrottleInterval spaces KeepAlive"
        " restarts, so a crash loop spends protection domains no faster than one under"
        " KeepAlive; the start sweep still runs at once (orphans are caught while killable)",
    )
    simulated_jaccl: bool = Field(
        default=False,
        description="test-only: JACCL is the testbed's simulation (serve.python is its"
        " shim; testbed/README.md). `check-config` refuses it unless"
        " --allow-simulated-jaccl; the wrapper logs a warning at every start",
    )

    identity_file: AbsolutePath | None = Field(
        default=None,
        description="the private key the wrapper logs in to the model's other nodes with, to"
        " run the node helpers there (`mlx-medic render authorized-keys` pins its `.pub` on"
        " them to what the wrapper sends, `--key serve`; the remediator's key refuses the"
        " wrapper's start sweep); host keys are"
        " checked against `ssh.known_hosts`; null: the service user's own default keys, as"
        " mlx.launch's ssh uses",
    )

    @field_validator("lease")
    @classmethod
    def _lease_positive(cls, value: float) -> float:
        if value < 3:
            raise ValueError("a lease shorter than 3s cannot be renewed in time over SSH")
        return value


# Command texts (as `process_model.command_text` gives them) of processes that are never a
# model's: a pattern that matches one of them would put shells, sshd or grep in the model's
# scope, and the sweep acts on what is in scope.
_NOT_A_MODEL_PROCESS = (
    "bash",
    "sh -c true",
    "zsh -l",
    "sshd",
    "launchd",
    "python3",
    "ssh ai002 true",
    "grep serve.py",
    "kill 1",
    "sleep 1",
)


def _process_regex(value: str) -> str:
    if not value:
        raise ValueError("an empty pattern matches nothing useful")
    try:
        regex = re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from exc
    for text in _NOT_A_MODEL_PROCESS:
        if regex.fullmatch(text):
            raise ValueError(
                f"too broad: it matches `{text}`; name the script or module first,"
                r" e.g. 'serve\.py --model \S+ --port 8080( .*)?'"
            )
    return value


ProcessRegex = Annotated[str, AfterValidator(_process_regex)]


class ProcessPatterns(StrictModel, ProcessPatternsMethods):
    """The model's own processes by command line, for ranks that are not mlx_lm.server
    or mlx_lm.share (the seed runs `serve.py` and `mlx-share-rank.py`).

    A pattern is a Python regular expression that must match the whole command text:
    what runs (the script's file name, the module after `-m`, or the program's file
    name; never the interpreter), then its arguments, joined by single spaces.
    """

    rank: list[ProcessRegex] = Field(
        default_factory=list,
        description="command texts of the model's ranks, e.g. `serve\\.py --model \\S+"
        " --port 8080( .*)?` for `python3 /opt/seed/serve.py --model M --port 8080 ...`;"
        " a full match of the script's (or module's, or program's) file name and the"
        " arguments joined by single spaces, tried before `share`. The arguments match in"
        " the order written; to match any order, use lookaheads:"
        " `serve\\.py(?=.* --model \\S+( |$))(?=.* --port 8080( |$))( .*)?` matches"
        " `--port 8080 --host H --model M` too",
    )
    share: list[ProcessRegex] = Field(
        default_factory=list,
        description="command texts of the model's share ranks (role `share`), e.g."
        " `mlx-share-rank\\.py .*--tmpdir /Users/ai/\\.cache/mlx-share/glm( .*)?`",
    )


class Model(StrictModel, ModelMethods):
    """One served model: its ranks, where they run, and how they are started."""

    name: Name = Field(description="the alert's `model` label")
    model: str = Field(min_length=1, description="the --model argument: repo id or local path")
    nodes: list[Name] = Field(min_length=1, description="rank order; the first is the head")
    port: int = Field(ge=1, le=65535, description="the port mlx_lm.server listens on (head)")
    host: str = Field(default="127.0.0.1", description="address mlx_lm.server listens on")
    service: Service = Field(description="the service that runs the model on its head node")
    backends: Backends = Field(description="how to start the ranks, in order of preference")
    serve_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="extra mlx_lm.server flags, without dashes (`prefill-step-size: 2048`);"
        " `true` is a bare flag, `false` leaves it out",
    )
    serve: ServeSettings = Field(
        default_factory=ServeSettings,
        description="how `mlx-medic serve` launches the ranks: interpreter, ring ports, smoke"
        " test limit, lease",
    )
    tmp_dirs: list[Path] = Field(
        default_factory=list,
        description="where the model's runs make `tmp*` dirs (mlx_lm.share): their stale"
        " entries are counted (and the `clean` helper removes them); a process whose"
        " arguments point under one belongs to the model",
    )
    cache_dirs: list[Path] = Field(
        default_factory=list,
        description="further dirs whose stale `tmp*` entries are counted and cleaned as"
        " `tmp_dirs`' are (processes are not told apart by them); a dir that"
        " several models on a node name is one shared dir (`check-config` lists them)",
    )
    log_files: list[Path] = Field(
        default_factory=list,
        description="the service's logs on the head node, read for error signatures;"
        " `mlx-medic render` sends the service's stderr to the first and stdout to the"
        " second (both to the only one)",
    )
    ranks_per_node: int = Field(
        default=1,
        ge=1,
        le=64,
        description="live ranks the model runs on each of its nodes (raised to what a live"
        " rank's own launch places on the node); ranks beyond it are orphans (excess ranks)"
        " when the evidence tells which, else suspects",
    )
    process_patterns: ProcessPatterns = Field(
        default_factory=ProcessPatterns,
        description="the model's own rank and share processes by command line, when they"
        " are not mlx_lm.server or mlx_lm.share; a matching process is the model's, with"
        " that role",
    )
    policy: Policy = Field(
        default_factory=Policy, description="limits on automatic action for this model"
    )

    @field_validator("nodes")
    @classmethod
    def _nodes_unique(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if name in seen:
                raise ValueError(f"node {name!r} is listed twice")
            seen.add(name)
        return value

    @field_validator("serve_args")
    @classmethod
    def _serve_args_are_flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        for flag in value:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", flag):
                raise ValueError(f"{flag!r} is not a flag name (write it without leading dashes)")
        reserved = {"model", "port", "host", "pipeline"} & set(value)
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set from the model's own fields")
        return value

    @field_validator("tmp_dirs", "cache_dirs", "log_files")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for path in value:
            if not path.is_absolute():
                raise ValueError(f"{str(path)!r} must be an absolute path")
            if ".." in path.parts:
                raise ValueError(f"{str(path)!r} must not contain '..'")
            if path == Path("/"):
                raise ValueError("'/' is not a tmp, cache or log location")
        return value


class Signature(StrictModel):
    """An error text to count in service logs; a regular expression."""

    name: Name = Field(
        description="the `signature` label of mlx_log_errors_total; a built-in's name replaces it"
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
        description="a playbook step may run for the longer of this and the model's"
        " `start_timeout`, plus 60 s, before it counts as failed",
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


# --- loading, with line numbers for every error ---------------------------

# Top-level lists that the file may also write as mappings keyed by each entry's name.
KEYED_SECTIONS = ("nodes", "models")


def _line_index(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_index(value_node, (*path, key), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_index(item, (*path, index), out)


def _normalise(raw: Any) -> tuple[Any, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """Accept `nodes:`/`models:` as mappings keyed by name (the readable form).

    Returns the data in list form and a map from list paths back to the
    mapping paths, so errors point at the lines the user wrote.
    """
    back: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    if not isinstance(raw, dict):
        return raw, back
    data = dict(raw)
    for section in KEYED_SECTIONS:
        value = data.get(section)
        if isinstance(value, dict):
            items = []
            for index, (name, body) in enumerate(value.items()):
                entry = dict(body) if isinstance(body, dict) else body
                if isinstance(entry, dict):
                    entry.setdefault("name", name)
                items.append(entry)
                back[(section, index)] = (section, name)
            data[section] = items
    return data, back


def _error_location(loc: tuple[Any, ...], back: dict[tuple[Any, ...], tuple[Any, ...]]) -> tuple:
    if len(loc) >= 2 and (loc[0], loc[1]) in back:
        return back[(loc[0], loc[1])] + tuple(loc[2:])
    return tuple(loc)


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


# Keys of the seed's own inventory that mean one of our fields.
_SEED_KEYS = {
    ("models", "extra_params"): "`serve_args` (the seed's `extra_params`: the same flags"
    " without dashes, e.g. `serve_args: {prefill-step-size: 2048}`)",
}


def _unknown_field(loc: tuple[Any, ...]) -> str:
    if len(loc) == 3 and (loc[0], loc[2]) in _SEED_KEYS:
        return f"unknown field: mlx-medic calls it {_SEED_KEYS[(loc[0], loc[2])]}"
    return "unknown field (check the spelling)"


# libyaml's loader where PyYAML has it: every node helper loads the inventory at start.
_FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line_numbers(text: str) -> dict[tuple[Any, ...], int]:
    """Each key path's line, for error messages (composed only when there is an error)."""
    lines: dict[tuple[Any, ...], int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        _line_index(root, (), lines)
    return lines


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    try:
        raw = yaml.load(text, Loader=_FAST_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InventoryError(source, [f"{where}not valid YAML: {exc}"]) from exc
    if raw is None:
        raise InventoryError(source, ["the file is empty; it needs at least `nodes:`"])
    if not isinstance(raw, dict):
        raise InventoryError(
            source, ["the top level must be a mapping with `nodes:` and `models:`"]
        )
    data, back = _normalise(raw)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        lines = _line_numbers(text)
        problems = []
        for error in exc.errors():
            loc = _error_location(tuple(error["loc"]), back)
            line = None
            probe = loc
            while probe and line is None:
                line = lines.get(probe)
                probe = probe[:-1]
            where = f"line {line}: " if line else ""
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = _unknown_field(loc)
            problems.append(f"{where}{_format_loc(loc)}: {message}")
        raise InventoryError(source, problems) from exc


def load_inventory(path: str | Path) -> Inventory:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(str(path), [f"not UTF-8 text: {exc}"]) from exc
    return parse_inventory(text, str(path))


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"
