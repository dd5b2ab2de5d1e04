"""The remediator's own settings (the cluster itself is in the inventory)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlx_medic.inventory import Duration, parse_duration


def default_state_dir() -> Path:
    """The user's state dir (XDG), the embedded default for the journal."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mlx-medic"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuthConfig(_Strict):
    """Credentials Alertmanager sends: `authorization.credentials_file` (bearer)
    or `basic_auth.password_file`. Secrets live in files, never in this config."""

    bearer_token_file: Path | None = None
    basic_username: str | None = None
    basic_password_file: Path | None = None

    @model_validator(mode="after")
    def _pairs(self) -> AuthConfig:
        if (self.basic_username is None) != (self.basic_password_file is None):
            raise ValueError("basic auth needs both basic_username and basic_password_file")
        return self

    @property
    def configured(self) -> bool:
        return self.bearer_token_file is not None or self.basic_password_file is not None


class TlsConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = Field(default=None, description="set to require client certs")


class RoutingConfig(_Strict):
    """Which alert names start which playbook (by name: the remediator's built-in
    playbooks), and which label names the model."""

    playbooks: dict[str, str] = Field(default_factory=lambda: {"LLMModelDown": "recover"})
    model_label: str = Field(default="model", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class RemediatorConfig(_Strict):
    inventory: Path = Path("/etc/mlx-medic/inventory.yaml")
    journal: Path = Field(default_factory=lambda: default_state_dir() / "journal.sqlite")
    listen: str = "127.0.0.1:10901"
    auth: AuthConfig = Field(default_factory=AuthConfig)
    insecure_no_auth: bool = False
    tls: TlsConfig | None = None
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    dry_run: bool = False
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_alert_age: Duration = Field(default=6 * 3600.0, description="older firings are stale")
    lock_wait: Duration = Field(
        default=60.0,
        description="how long an alert's run waits for a model lock another holder has (a"
        " serve wrapper holds it while its ranks start) before it ends as locked",
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

    @field_validator("max_alert_age", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)


class ConfigError(ValueError):
    pass


def check_routing(routing: RoutingConfig, playbooks: Iterable[str]) -> None:
    """Every routed playbook name is one the remediator has; else a ConfigError naming it."""
    known = sorted(playbooks)
    unknown = [
        f"{alertname}: unknown playbook {name!r}"
        for alertname, name in routing.playbooks.items() if name not in known
    ]
    if unknown:
        raise ConfigError(
            f"routing.playbooks: {'; '.join(unknown)} (playbooks: {', '.join(known) or 'none'})"
        )


def load_config(path: Path | None) -> RemediatorConfig:
    """The file's settings over the embedded defaults; no file means all defaults."""
    if path is None:
        return RemediatorConfig()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return RemediatorConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from exc
