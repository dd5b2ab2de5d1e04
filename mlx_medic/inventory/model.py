"""One served model's section of the inventory (`models.<name>`): its nodes and port, the
service that runs it, its backends, its own processes by command line, and its dirs.
Its run settings (`policy`, `serve`) are in `mlx_medic.inventory.model_settings`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from mlx_medic.inventory.fields import USER_NAME_PATTERN, AbsolutePath, Name, StrictModel
from mlx_medic.inventory.methods import (
    BackendsMethods,
    ModelMethods,
    ProcessPatternsMethods,
    ServiceMethods,
)
from mlx_medic.inventory.model_settings import Policy, ServeSettings

ServiceManager = Literal["launchd", "systemd", "supervisord"]
ServiceKind = Literal["wrapper", "script"]


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
        description="supervisord: the supervisord.conf that supervisorctl reads (`-c`); without"
        " `sudo`, the head asks supervisord over the unix socket its `[supervisorctl]` section"
        " names (the calls supervisorctl makes, without starting it), and runs supervisorctl"
        " where it names none; null: supervisorctl's own default",
    )
    sudo: bool = Field(
        default=False,
        description="supervisord: run supervisorctl as `sudo -n /usr/bin/supervisorctl ...`"
        " (a root-only supervisord socket; `mlx-medic render sudoers` writes the rule); false:"
        " as the helper's user (supervisord's socket, or plain `supervisorctl`), the socket's"
        " permissions decide. launchctl and systemctl"
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


# Command texts (as `processes.command_line.command_text` gives them) of processes that are never a
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

    @model_validator(mode="after")
    def _preseed_staged_where_cleaned(self) -> Model:
        preseed = self.serve.preseed
        if not preseed.enabled:
            return self
        if self.backends.ring is None:
            raise ValueError("serve.preseed needs the ring backend: mlx_lm.share runs over it")
        weights = self.weights_path()
        if weights is None:
            raise ValueError(
                f"serve.preseed: `model` ({self.model}) is no local path; name the weights'"
                " dir in serve.preseed.path"
            )
        if weights.parent not in self.scope_dirs():
            raise ValueError(
                f"serve.preseed stages in {weights.parent} (beside {weights}): list it in"
                " tmp_dirs or cache_dirs, so the clean removes what a killed share leaves"
            )
        return self

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
