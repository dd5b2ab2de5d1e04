"""Playbooks: what a run does to a model, as an explicit plan of steps.

Why a plan first: the whole run can be shown (dry run, on-call log) before any
of it happens, and each step is journaled before it starts. The engine owns the
control flow (order, fallback after a failed verify, escalation); a playbook
only plans steps and executes one at a time.
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from mlx_medic.inventory import Inventory, Model
from mlx_medic.transport import NodeTransport

StepKind = Literal["action", "verify", "escalate"]
StepOutcome = Literal["ok", "failed", "not_implemented"]


@dataclass(frozen=True)
class PlannedStep:
    name: str
    node: str
    description: str
    argv: list[str] | None = None  # the exact command, when the step is one command
    targets: list[str] = field(default_factory=list)
    kind: StepKind = "action"
    backend: str | None = None  # set on start/verify steps
    fallback: bool = False  # reached only after an earlier verify failed


@dataclass
class StepResult:
    outcome: StepOutcome
    detail: str = ""
    output: str = ""
    exit_status: int | None = None
    unrecoverable: bool = False  # a restart cannot fix this: escalate, open the circuit
    next_action: str | None = None  # in words, for on-call


@dataclass
class RunContext:
    model: Model
    inventory: Inventory
    transport: NodeTransport
    run_id: int
    dry_run: bool
    health_check: Callable[[Model], Awaitable[bool]]
    log: logging.Logger


class Playbook(ABC):
    name: str = "playbook"

    @abstractmethod
    def plan(self, model: Model, inventory: Inventory) -> list[PlannedStep]:
        """Every step the run may take, in order, including fallback steps."""

    @abstractmethod
    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        """Do one step. Never called in dry run."""


def service_argv(model: Model, action: Literal["stop", "start"]) -> list[str]:
    """The service manager's own command to stop or start the model's service.

    launchd: `bootout` unloads the KeepAlive job so it cannot respawn ranks while
    the nodes are swept; `bootstrap` loads it again from its plist.
    """
    label = model.service.label
    match model.service.manager:
        case "launchd":
            if action == "stop":
                return ["launchctl", "bootout", f"system/{label}"]
            return ["launchctl", "bootstrap", "system", f"/Library/LaunchDaemons/{label}.plist"]
        case "systemd":
            return ["systemctl", action, label]
        case "supervisord":
            return ["supervisorctl", action, label]
    raise ValueError(f"unknown service manager {model.service.manager!r}")


class RecoverPlaybook(Playbook):
    """The seed incident's order: stop the service, sweep every node, clean tmp
    dirs, start on JACCL, verify, fall back to ring with --pipeline, escalate."""

    name = "recover"

    def plan(self, model: Model, inventory: Inventory) -> list[PlannedStep]:
        head = model.head
        steps = [
            PlannedStep(
                "stop-service", head,
                f"stop {model.service.manager} service {model.service.label} so it cannot"
                " respawn ranks during the sweep",
                argv=service_argv(model, "stop"), targets=[model.service.label],
            )
        ]
        scope = [f"port {model.port}", *(str(d) for d in model.tmp_dirs)]
        for node in model.nodes:
            steps.append(
                PlannedStep(
                    "sweep", node,
                    f"kill {model.name} ranks on {node} (scope: {', '.join(scope)});"
                    f" never the :{model.port} listener",
                    targets=[f"{model.name} ranks on {node}"],
                )
            )
        if model.scope_dirs():  # tmp_dirs and cache_dirs alike, as the exporter weighs them
            for node in model.nodes:
                steps.append(
                    PlannedStep(
                        "clean-tmp", node,
                        f"remove stale tmp* dirs of {model.name} on {node}, after the sweep",
                        targets=[f"{d}/tmp*" for d in model.scope_dirs()],
                    )
                )
        for index, (backend, spec) in enumerate(model.backends.in_order()):
            fallback = index > 0
            split = " with --pipeline" if spec.pipeline else ""
            if fallback:
                steps.append(
                    PlannedStep(
                        "stop-service", head,
                        f"stop the service again before falling back to {backend}",
                        argv=service_argv(model, "stop"), targets=[model.service.label],
                        fallback=True,
                    )
                )
            steps.append(
                PlannedStep(
                    f"start-{backend}", head,
                    f"start {model.name} on {backend} (hostfile {spec.hostfile}){split}",
                    argv=service_argv(model, "start"),
                    targets=[model.service.label, str(spec.hostfile)],
                    backend=backend, fallback=fallback,
                )
            )
            steps.append(
                PlannedStep(
                    f"verify-{backend}", head,
                    f"health probe {model.host}:{model.port}, up to"
                    f" {model.policy.start_timeout:g}s",
                    targets=[f"{model.host}:{model.port}"],
                    kind="verify", backend=backend, fallback=fallback,
                )
            )
        steps.append(
            PlannedStep(
                "escalate", head,
                "every backend failed verification: page on-call",
                kind="escalate", fallback=True,
            )
        )
        return steps

    async def execute(self, step: PlannedStep, context: RunContext) -> StepResult:
        model = context.model
        if step.kind == "verify":
            healthy = await context.health_check(model)
            return StepResult("ok" if healthy else "failed", detail=f"healthy={healthy}")
        if step.kind == "escalate":
            nodes = ", ".join(model.nodes)
            return StepResult(
                "ok",
                detail="every backend failed verification",
                unrecoverable=True,
                next_action=(
                    f"stop every rank of {model.name}, check the Thunderbolt links"
                    f" (`ibv_devinfo`: PORT_ACTIVE), reboot all its nodes ({nodes})"
                ),
            )
        return StepResult(
            "not_implemented",
            detail=f"step {step.name!r} has no implementation yet; nothing was done",
        )


BUILTIN_PLAYBOOKS: dict[str, type[Playbook]] = {"recover": RecoverPlaybook}


class PlaybookError(ValueError):
    pass


def load_playbook(name: str) -> Playbook:
    """A built-in by name, or `package.module:Class` (the config is trusted)."""
    if name in BUILTIN_PLAYBOOKS:
        return BUILTIN_PLAYBOOKS[name]()
    module_name, sep, class_name = name.partition(":")
    if not sep or not module_name or not class_name:
        raise PlaybookError(
            f"unknown playbook {name!r}: use one of {sorted(BUILTIN_PLAYBOOKS)}"
            " or 'package.module:Class'"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise PlaybookError(f"cannot load playbook {name!r}: {exc}") from exc
    playbook = cls()
    if not all(callable(getattr(playbook, m, None)) for m in ("plan", "execute")):
        raise PlaybookError(f"playbook {name!r} has no plan() and execute()")
    return playbook
