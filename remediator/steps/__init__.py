"""A playbook's steps, one module each: each describes itself and runs itself."""

from mlx_medic.remediator.steps.backend import PinRing
from mlx_medic.remediator.steps.base import (
    REMEDIATOR_RUN,
    HealthCheck,
    RunContext,
    StartMarks,
    Step,
    StepDescription,
    StepKind,
    StepResult,
    describe_plan,
    is_run_by,
    run_by,
)
from mlx_medic.remediator.steps.clean import CleanTmp
from mlx_medic.remediator.steps.escalate import Escalate
from mlx_medic.remediator.steps.preflight import Preflight
from mlx_medic.remediator.steps.service import StartService, StopService
from mlx_medic.remediator.steps.sweep import Sweep
from mlx_medic.remediator.steps.verify import Verify

__all__ = [
    "REMEDIATOR_RUN",
    "CleanTmp",
    "Escalate",
    "HealthCheck",
    "PinRing",
    "Preflight",
    "RunContext",
    "StartMarks",
    "StartService",
    "Step",
    "StepDescription",
    "StepKind",
    "StepResult",
    "StopService",
    "Sweep",
    "Verify",
    "describe_plan",
    "is_run_by",
    "run_by",
]
