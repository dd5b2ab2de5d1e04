"""Helpers for the remediator core tests: an inventory, alerts, a controllable
health check, and playbooks (instances, handed to the engine) that succeed, fail, wait
to be released, or act while the model is up."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import psutil
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import BackendName
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockHandle
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus
from mlx_medic.remediator.config import ConfigSource, RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.model_health import HealthVerdict, ModelState
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks import (
    REBOOT_NODE,
    Playbook,
    RebootNodePlaybook,
    RecheckVerdict,
    RecoverPlaybook,
    SweepOrphansPlaybook,
    recheck_model_down,
)
from mlx_medic.remediator.steps import (
    Escalate,
    RunContext,
    Step,
    StepDescription,
    StepKind,
    StepResult,
    Verify,
)
from mlx_medic.transport import LocalTransport, NodeTransport

MODEL = "glm-4_6-5b"
OTHER = "qwq-32b-8bit"
MEDIC = str(Path(sys.executable).with_name("mlx-medic"))  # this venv's console script


def inventory_text(state_dir: Path, *, medic_config: Path | None = None, **policy: Any) -> str:
    """With `medic_config` (where this text is written), every node runs this venv's
    mlx-medic with it: node helpers called through a LocalTransport then work here."""
    helpers = {"medic_command": MEDIC, "medic_config": str(medic_config)} if medic_config else {}
    data = {
        "state_dir": str(state_dir),
        "nodes": {f"ai00{i}": {"ssh": f"127.0.0.{i + 1}", **helpers} for i in range(1, 6)},
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
    """The two-model inventory, written to a temp dir of its own (removed at exit) with its
    state dir there: the model lock's node helpers, run here, read it and keep state there."""
    directory = Path(tempfile.mkdtemp(prefix="mlx-medic-inventory-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "inventory.yaml"
    path.write_text(inventory_text(directory / "state", medic_config=path, **policy))
    return load_inventory(path)


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
    """Health check double: `verdicts` are answered first, in order; then `up` decides
    (up or down, never "could not tell"). `gate` (when set) holds runs queued."""

    def __init__(self, up: bool = False, verdicts: list[HealthVerdict] | None = None):
        self.up = up
        self.verdicts = list(verdicts or [])
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, model: Model) -> HealthVerdict:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.verdicts:
            return self.verdicts.pop(0)
        return HealthVerdict.up("up") if self.up else HealthVerdict.down("down")


def let_go_once_the_run_waits(engine: Engine, lock: Path) -> asyncio.Task[None]:
    """A lock holder (a serve wrapper starting) that removes its lock once a run of
    `engine` has found it held, so the run is waiting for it however slowly this machine
    got there (the lock's helper is a process of its own). Call before submitting."""
    refused = asyncio.Event()
    try_acquire = engine.locks._try_acquire

    async def trying(*args: Any, **kwargs: Any) -> Any:
        taken = await try_acquire(*args, **kwargs)
        if not isinstance(taken, LockHandle):
            refused.set()
        return taken

    engine.locks._try_acquire = trying  # type: ignore[method-assign]

    async def let_go() -> None:
        await refused.wait()
        lock.unlink()

    return asyncio.create_task(let_go())


# --- steps ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Touch(Step):
    """A harmless action on the head that succeeds."""

    model: Model
    name: str = "touch"

    def describe(self) -> StepDescription:
        return StepDescription(
            self.name, self.model.head, "a harmless action", targets=[self.model.name]
        )

    async def run(self, context: RunContext) -> StepResult:
        return StepResult(StepOutcome.OK, detail=f"{self.name} done")


@dataclass(frozen=True, kw_only=True)
class PassingVerify(Step):
    """A verify that passes whatever the health check says: the run 'fixes' the model."""

    kind: ClassVar[StepKind] = StepKind.VERIFY
    model: Model

    def describe(self) -> StepDescription:
        return StepDescription("verify-ring", self.model.head, "health")

    async def run(self, context: RunContext) -> StepResult:
        return StepResult(StepOutcome.OK, detail="verify-ring done", backend="ring")


@dataclass(frozen=True, kw_only=True)
class WaitForRelease(Touch):
    """Says it entered, then waits until its playbook's gate is released."""

    gate: GatedPlaybook

    async def run(self, context: RunContext) -> StepResult:
        self.gate.entered.set()
        await self.gate.release.wait()
        return await super().run(context)


@dataclass(frozen=True, kw_only=True)
class FindsAHungNode(Touch):
    """A node hangs: it takes SSH connections but answers no command. A restart cannot fix
    that; a person must look at the node (what survives SIGKILL is no such state: a sweep
    names it and the run goes on)."""

    async def run(self, context: RunContext) -> StepResult:
        return StepResult(
            StepOutcome.UNREACHABLE,
            detail="ai002 did not answer the sweep: timed out after 30s",
            unrecoverable=True,
            next_action="check that ai002 is up and answers SSH, reboot it if it hangs",
        )


# --- playbooks -----------------------------------------------------------------------


class SucceedingPlaybook(Playbook):
    """Recover's re-check, one action and a verify that passes."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [Touch(model=model), PassingVerify(model=model)]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        return await recheck_model_down(context)


class GatedPlaybook(SucceedingPlaybook):
    """Like SucceedingPlaybook, but its first step waits for `release` (after setting
    `entered`): a run that holds the model until the test lets go."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [WaitForRelease(model=model, gate=self), PassingVerify(model=model)]


class UnrecoverablePlaybook(SucceedingPlaybook):
    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [FindsAHungNode(model=model), PassingVerify(model=model)]


class StartAndVerifyPlaybook(SucceedingPlaybook):
    """Recover's shape with harmless starts: start and the real verify per backend, the
    later backends as fallbacks, then escalate."""

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        steps: list[Step] = []
        for index, (backend, _spec) in enumerate(model.backends.in_order()):
            steps += [
                Touch(model=model, name=f"start-{backend}", fallback=index > 0),
                Verify(model=model, backend=backend, fallback=index > 0, within=0),
            ]
        return [*steps, Escalate(model=model, fallback=True)]


class ActsWhileUpPlaybook(Playbook):
    """Like a playbook that removes orphans from a serving model: acts only while the
    model is up, then checks it still serves."""

    backend: ClassVar[BackendName] = "jaccl"

    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        return [
            Touch(model=model, name="remove-orphans"),
            Verify(model=model, backend=self.backend, within=0),
        ]

    async def recheck(self, context: RunContext) -> RecheckVerdict:
        verdict = await context.health(context.model)
        if verdict.state is ModelState.UP:
            return RecheckVerdict.act(f"model is up: {verdict.reason}")
        return RecheckVerdict.skip(f"not while the model is {verdict.state}: {verdict.reason}")


def fake_playbooks() -> dict[str, Playbook]:
    """Fresh instances by name, beside the built-in `recover`."""
    return {
        "recover": RecoverPlaybook(),
        "sweep-orphans": SweepOrphansPlaybook(clean_window=0.0),  # no real waits
        "succeeding": SucceedingPlaybook(),
        "gated": GatedPlaybook(),
        "unrecoverable": UnrecoverablePlaybook(),
        "start-and-verify": StartAndVerifyPlaybook(),
        "acts-while-up": ActsWhileUpPlaybook(),
        REBOOT_NODE: RebootNodePlaybook(),
    }


def make_config(tmp_path: Path, playbook: str = "recover", **overrides: Any) -> RemediatorConfig:
    data: dict[str, Any] = {
        "journal": tmp_path / "journal" / "journal.sqlite",
        "routing": {"playbooks": {"LLMModelDown": playbook}},
    }
    data.update(overrides)
    return RemediatorConfig.model_validate(data)


def make_engine(
    config: RemediatorConfig,
    inventory: Inventory,
    *,
    playbooks: dict[str, Playbook] | None = None,
    transport: NodeTransport | None = None,
    health: Any = None,
    hostname: str = "replica-a",
    journal: Journal | None = None,
    registry: CollectorRegistry | None = None,
    tmp_path: Path | None = None,
    config_source: ConfigSource | None = None,
    clock: Callable[[], float] = time.time,
) -> Engine:
    """An engine with `fake_playbooks()`, and `playbooks` over them (e.g. a test's gate)."""
    if transport is None:
        assert tmp_path is not None
        transport = LocalTransport()
    return Engine(
        config,
        inventory,
        journal or Journal(config.journal),
        transport,
        playbooks={**fake_playbooks(), **(playbooks or {})},
        health_check=health if health is not None else Health(up=False),
        registry=registry or CollectorRegistry(),
        hostname=hostname,
        config_source=config_source,
        clock=clock,
    )


def hold_lock(inventory: Inventory) -> Path:
    """A serve wrapper on the head holds MODEL's lock (this live process plays it)."""
    path = inventory.state_dir / "locks" / f"{MODEL}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    info = {
        "node": "ai001",
        "pid": me,
        "pid_start": psutil.Process(me).create_time(),
        "host": "head",
        "time": 0.0,
        "holder": "serve",
        "run_id": "r1",
        "expires": 0.0,
    }
    path.write_text(json.dumps(info))
    return path


def dead_pid() -> int:
    """A pid that just ended (a real process of this host, reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


class Clock:
    """A wall clock a test sets and jumps."""

    def __init__(self, now: float = 100_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def acted(journal: Journal, at: float) -> None:
    """A run of MODEL that acted at `at`: counted against its budget."""
    run_id = journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="alert", owner="h:1", now=at
    )
    journal.start_run(run_id, at)
    journal.mark_counted(run_id)
