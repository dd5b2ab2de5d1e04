"""The remediator's own settings (the cluster itself is in the inventory)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, field_validator, model_validator

from mlx_medic.file_problems import FileProblems
from mlx_medic.inventory.fields import Duration, StrictModel
from mlx_medic.listen_address import parse_listen
from mlx_medic.remediator.journal.retention import Retention
from mlx_medic.yaml_config import parse_mapping, read_text, validate

# Where the service's config is when no `--config.file` is given: the environment variable
# the shipped units set, else the path they use (deploy/systemd, deploy/launchd).
CONFIG_ENV = "MLX_MEDIC_CONFIG"
DEFAULT_CONFIG_FILE = Path("/etc/mlx-medic/remediator.yml")
FLAG_FOUND_BY = "--config.file"
DEFAULT_PATH_FOUND_BY = "the default path"


@dataclass(frozen=True)
class ConfigSource:
    """A config file and how it was found, said to the user beside the journal it names."""

    path: Path
    found_by: str  # FLAG_FOUND_BY, "$MLX_MEDIC_CONFIG" or DEFAULT_PATH_FOUND_BY

    @property
    def is_default(self) -> bool:
        """Found at the default path: a bare command finds it too, wherever it is typed."""
        return self.found_by == DEFAULT_PATH_FOUND_BY

    def __str__(self) -> str:
        return f"{self.path} ({self.found_by})"


def command_line(source: ConfigSource | None, *words: str) -> str:
    """`mlx-medic WORDS` as on-call types it to reach the journal `source` names, for hints
    to copy: bare when the config is at the default path (or there is none), else with its
    `--config.file`."""
    line = ["mlx-medic", *words]
    if source is not None and not source.is_default:
        line += ["--config.file", str(source.path)]
    return shlex.join(line)


def resume_command(source: ConfigSource | None, model: str | None) -> str:
    """The command that lifts a pause or open circuit of `model` (None: of all models)."""
    return command_line(source, "resume", *([model] if model else []))


def find_config_file(flag: Path | None) -> ConfigSource | None:
    """`--config.file`, else `$MLX_MEDIC_CONFIG`, else the default path if that file exists;
    None when there is none of them. The service and the on-call commands find it alike,
    so a command without the flag reads the journal the service writes."""
    if flag is not None:
        return ConfigSource(flag, FLAG_FOUND_BY)
    from_env = os.environ.get(CONFIG_ENV)
    if from_env:
        return ConfigSource(Path(from_env), f"${CONFIG_ENV}")
    if DEFAULT_CONFIG_FILE.is_file():
        return ConfigSource(DEFAULT_CONFIG_FILE, DEFAULT_PATH_FOUND_BY)
    return None


def default_state_dir() -> Path:
    """The user's state dir (XDG), the embedded default for the journal."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mlx-medic"


class SecretFiles(StrictModel):
    """One set of credentials: a bearer token and/or a basic auth pair, each secret in a
    file (never in this config) so it can be rotated there."""

    bearer_token_file: Path | None = None
    basic_username: str | None = None
    basic_password_file: Path | None = None

    @model_validator(mode="after")
    def _pairs(self) -> SecretFiles:
        if (self.basic_username is None) != (self.basic_password_file is None):
            raise ValueError("basic auth needs both basic_username and basic_password_file")
        return self

    @property
    def configured(self) -> bool:
        return self.bearer_token_file is not None or self.basic_password_file is not None


class AuthConfig(SecretFiles):
    """Credentials Alertmanager sends: `authorization.credentials_file` (bearer)
    or `basic_auth.password_file`; they are accepted on every route. `read_only` is a
    second set accepted only for reading (the page, /api/*, /metrics), so the page can be
    shared without the power to post alerts; `read_only_open` serves reading to anyone."""

    read_only: SecretFiles | None = None
    read_only_open: bool = Field(
        default=False, description="serve /, /api/* and /metrics without credentials"
    )

    @model_validator(mode="after")
    def _read_only(self) -> AuthConfig:
        if self.read_only is not None and not self.read_only.configured:
            raise ValueError(
                "read_only names no credentials: give it bearer_token_file or basic_username"
                " + basic_password_file (or set read_only_open: true to open reading to all)"
            )
        if self.read_only is not None and self.read_only_open:
            raise ValueError(
                "read_only_open: true opens reading to anyone, so read_only credentials would"
                " never be asked for: set one or the other"
            )
        return self


class TlsConfig(StrictModel):
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = Field(default=None, description="set to require client certs")


class RoutingConfig(StrictModel):
    """Which alert names start which playbook (by name: the remediator's built-in
    playbooks), and which label names the model."""

    playbooks: dict[str, str] = Field(
        default_factory=lambda: {
            "LLMModelDown": "recover",
            "MLXOrphanProcesses": "sweep-orphans",
            # declined (unrouted) on a node without reboot.allowed: docs/drain.md
            "MLXUnkillableSurvivors": "reboot-node",
        }
    )
    model_label: str = Field(default="model", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class JournalRetention(StrictModel):
    """How much of the journal the service keeps (remediator/journal/retention.py): older
    runs and events go, then the oldest while it is over `max_bytes`; never the runs of
    the last `keep_days` or of a budget window, a pause, an open circuit, or the newest
    of each decision that needs a person."""

    max_age: Duration = Field(default=30 * 86400.0, description="older runs and events go")
    max_bytes: ByteSize = Field(
        default=ByteSize(512 << 20),
        ge=1 << 20,
        description="then the oldest go while the journal's rows take more (e.g. 512MiB)",
    )
    keep_days: int = Field(default=7, ge=0, description="runs of the last N days always stay")
    interval: Duration = Field(default=3600.0, ge=60, description="how often the service prunes")

    def bounds(self, budget_windows: Iterable[float]) -> Retention:
        """The bounds, keeping the runs of the longest of the models' budget windows."""
        return Retention(
            self.max_age,
            int(self.max_bytes),
            self.keep_days * 86400.0,
            max(budget_windows, default=0.0),
        )


class RemediatorConfig(StrictModel):
    inventory: Path = Path("/etc/mlx-medic/inventory.yaml")
    journal: Path = Field(default_factory=lambda: default_state_dir() / "journal.sqlite")
    journal_retention: JournalRetention = Field(default_factory=JournalRetention)
    listen: str = "127.0.0.1:10901"
    auth: AuthConfig = Field(default_factory=AuthConfig)
    insecure_no_auth: bool = False
    tls: TlsConfig | None = None
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    dry_run: bool = False
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    alerts_per_delivery: int = Field(
        default=1000,
        ge=0,
        description="new alerts taken from one webhook delivery; the rest are answered 503,"
        " which Alertmanager retries, and the retry resumes after them (0: no cap)",
    )
    alerts_per_second: int = Field(
        default=1000,
        ge=0,
        description="new alerts taken per second over all deliveries (a token bucket holding"
        " one second's worth); past it the delivery is answered 503 with Retry-After (0: no cap)",
    )
    max_alert_age: Duration = Field(default=6 * 3600.0, description="older firings are stale")
    lock_wait: Duration = Field(
        default=60.0,
        description="how long an alert's run waits for a model lock another holder has (a"
        " serve wrapper holds it while its ranks start) before it ends as locked",
    )
    lock_lease: Duration = Field(
        default=90.0,
        ge=3,
        description="the lease of a model lock this remediator holds off the inventory's nodes,"
        " renewed every third of it while its run goes on: once it runs out (the process"
        " died: a SIGKILL, a lost machine) another replica's run may break the lock",
    )
    max_parallel_runs: int = Field(
        default=8,
        ge=1,
        description="runs of different models that act at once (a model has at most one"
        " run); one past it waits, queued, until a run ends: it bounds the SSH sessions and"
        " node helpers a site-wide outage starts at once",
    )
    orphans_clean_window: Duration = Field(
        default=30.0,
        gt=0,
        description="a sweep-orphans run ends only once its nodes were seen without orphans"
        " in two checks this far apart (sweeping any that come back), so Prometheus has"
        " scraped and evaluated a zero and the orphan alert resolves: at least one scrape"
        " interval plus one rule evaluation interval (15s + 15s as rendered)",
    )
    notify_url: str | None = Field(default=None, description="POSTed a JSON escalation")
    node: str | None = Field(
        default=None,
        description="the inventory name of the node this remediator runs on, if it runs on"
        " one (else `<state_dir>/node-id` is read); never guessed from addresses",
    )
    probe_from: Literal["auto", "remediator", "head"] = Field(
        default="auto",
        description="where the re-check probes a model: 'auto' probes a loopback listener on"
        " its head node over SSH (`medic_command probe`) unless `node` is that head;"
        " 'head' always probes there; 'remediator' always probes from here",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value, default_host="127.0.0.1")  # as the service will, before it listens
        return value


class ConfigError(ValueError):
    """The remediator's config cannot be used."""

    def report(self) -> str:
        return str(self)


class ConfigFileError(FileProblems, ConfigError):
    """The config file cannot be used: every problem with its line, as the inventory's
    (`unreadable`: the file could not be read at all)."""


def check_routing(routing: RoutingConfig, playbooks: Iterable[str]) -> None:
    """Every routed playbook name is one the remediator has; else a ConfigError naming it."""
    known = sorted(playbooks)
    unknown = [
        f"{alertname}: unknown playbook {name!r}"
        for alertname, name in routing.playbooks.items()
        if name not in known
    ]
    if unknown:
        raise ConfigError(
            f"routing.playbooks: {'; '.join(unknown)} (playbooks: {', '.join(known) or 'none'})"
        )


def load_config(path: Path | None) -> RemediatorConfig:
    """The file's settings over the embedded defaults. Without a path, the file
    find_config_file() finds; none found means all defaults."""
    source = find_config_file(path)
    return RemediatorConfig() if source is None else read_config(source)


def read_config(source: ConfigSource) -> RemediatorConfig:
    """The file's settings over the embedded defaults; a ConfigFileError names the file
    (and, when it came from the environment or the default path, how it was found)."""
    path = source.path
    name = str(path) if source.found_by == FLAG_FOUND_BY else str(source)
    text = read_text(path, name, ConfigFileError)
    raw = parse_mapping(text, name, ConfigFileError, "remediator")
    return validate(
        RemediatorConfig, raw, text, name, ConfigFileError, kind="remediator", path=str(path)
    )
