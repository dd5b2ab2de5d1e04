"""Helpers for the remediator core tests: an inventory, alerts, a controllable
health check and playbooks that succeed, fail, or wait to be released."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory import Inventory, Model, parse_inventory
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.playbook import PlannedStep, Playbook, RunContext, StepResult
from mlx_medic.transport import LocalTransport, NodeTransport

MODEL = "glm-4_6-5b"
OTHER = "qwq-32b-8bit"


def inventory_text(state_dir: Path, **policy: Any) -> str:
    data = {
        "state_dir": str(state_dir),
        "nodes": {f"ai00{i}": {"ssh": f"127.0.0.{i + 1}"} for i in range(1, 6)},
        "models": {
            MODEL: {
                "model": "mlx-community/GLM-4.6-5bit",
                "nodes": ["ai001", "ai002", "ai003", "ai004"],
                "port": 8080,
                "service": {"manager": "launchd", "label": f"com.example.{MODEL}"},
                "backends": {
                    "jaccl": {"hostfile": f"/etc/mlx-medic/{MODEL}.jaccl.json"},
                    "ring": {"hostfile": f"/etc/mlx-medic/{MODEL}.ring.json", "pipeline": True},
                },
                "tmp_dirs": [f"/Users/ai/.cache/mlx-share/{MODEL}"],
                "policy": {"restart_budget": 3, "window": "1h", "backoff": 0, **policy},
            },
            OTHER: {
                "model": "mlx-community/QwQ-32B-8bit",
                "nodes": ["ai005", "ai004"],
                "port": 8081,
                "service": {"manager": "systemd", "label": OTHER},
                "backends": {"ring": {"hostfile": f"/etc/mlx-medic/{OTHER}.ring.json"}},
            },
        },
    }
    return yaml.safe_dump(data, sort_keys=False)


def make_inventory(**policy: Any) -> Inventory:
    return parse_inventory(inventory_text(Path("/var/lib/mlx-medic"), **policy))


def alert(
    fingerprint: str = "f00d",
    model: str | None = MODEL,
    *,
    status: AlertStatus = AlertStatus.FIRING,
    starts_at: datetime | None = None,
    alertname: str = "LLMModelDown",
    labels: dict[str, str] | None = None,
) -> AlertEvent:
    all_labels = {"alertname": alertname, **({"model": model} if model is not None else {})}
    all_labels.update(labels or {})
    return AlertEvent(
        alertname=alertname,
        status=status,
        fingerprint=fingerprint,
        starts_at=starts_at or datetime.now(UTC) - timedelta(minutes=1),
        labels=all_labels,
    )


class Health:
    """Health check double: `up` decides; `gate` (when set) holds runs queued."""

    def __init__(self, up: bool = False):
        self.up = up
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, model: Model) -> bool:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.up


class Gate:
    """Process-wide release switch for GatedPlaybook (one per test)."""

    release: asyncio.Event | None = None
    entered: asyncio.Event | None = None

    @classmethod
    def reset(cls) -> None:
        cls.release = asyncio.Event()
        cls.entered = asyncio.Event()


class SucceedingPlaybook(Playbook):
    """One action and a verify that passes: a run that 'fixes' the model."""

    name = "succeeding"

    def plan(self, model: Model, inventory: Inventory) -> list[PlannedStep]:
        return [
            PlannedStep("touch", model.head, "a harmless action", targets=[model.name]),
            PlannedStep("verify-ring", model.head, "health", kind="verify", backend="ring"),
        ]

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        return StepResult("ok", detail=f"{step.name} done")


class GatedPlaybook(SucceedingPlaybook):
    """Like SucceedingPlaybook, but its first step waits for Gate.release."""

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        if step.name == "touch":
            assert Gate.release is not None and Gate.entered is not None
            Gate.entered.set()
            await Gate.release.wait()
        return StepResult("ok", detail=f"{step.name} done")


class UnrecoverablePlaybook(SucceedingPlaybook):
    """The sweep finds ranks that survive SIGKILL: only a reboot helps."""

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        return StepResult(
            "failed",
            detail="3 ranks in uninterruptible state survive SIGKILL",
            unrecoverable=True,
            next_action="reboot ai002: 3 ranks in uninterruptible state survive SIGKILL",
        )


PLAYBOOKS = {
    "succeeding": f"{__name__}:SucceedingPlaybook",
    "gated": f"{__name__}:GatedPlaybook",
    "unrecoverable": f"{__name__}:UnrecoverablePlaybook",
}


def make_config(tmp_path: Path, playbook: str = "recover", **overrides: Any) -> RemediatorConfig:
    name = PLAYBOOKS.get(playbook, playbook)
    data: dict[str, Any] = {
        "journal": tmp_path / "journal" / "journal.sqlite",
        "routing": {"playbooks": {"LLMModelDown": name}},
    }
    data.update(overrides)
    return RemediatorConfig.model_validate(data)


def make_engine(
    config: RemediatorConfig,
    inventory: Inventory,
    *,
    transport: NodeTransport | None = None,
    health: Any = None,
    hostname: str = "replica-a",
    journal: Journal | None = None,
    registry: CollectorRegistry | None = None,
    tmp_path: Path | None = None,
) -> Engine:
    if transport is None:
        assert tmp_path is not None
        transport = LocalTransport(tmp_path / "nodes")
    return Engine(
        config,
        inventory,
        journal or Journal(config.journal),
        transport,
        health_check=health if health is not None else Health(up=False),
        registry=registry or CollectorRegistry(),
        hostname=hostname,
    )


def dead_pid() -> int:
    """A pid that just ended (a real process of this host, reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
