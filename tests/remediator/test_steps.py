"""Steps describe themselves (what the dry run and the journal show) and run themselves;
the verify step and recover's re-check keep "could not tell" apart from "down"."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mlx_medic.inventory import Model
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks import RecheckVerdict, RecoverPlaybook
from mlx_medic.remediator.steps import (
    CleanTmp,
    RunContext,
    StartService,
    StepDescription,
    StepKind,
    StopService,
    Sweep,
    Verify,
)
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import MODEL, Health, make_inventory

INVENTORY = make_inventory()


def context(health: Health, tmp_path: Path) -> RunContext:
    model = INVENTORY.model(MODEL)
    return RunContext(model=model, inventory=INVENTORY, transport=LocalTransport(),
                      run_id=1, health=health, log=logging.getLogger("test"))


def model() -> Model:
    return INVENTORY.model(MODEL)


def test_each_step_describes_itself_with_its_node_targets_and_command() -> None:
    m = model()
    assert StopService(model=m).describe() == StepDescription(
        "stop-service", "ai001",
        f"stop launchd service com.example.{MODEL} so it cannot respawn ranks during the sweep",
        targets=[f"com.example.{MODEL}"],
        argv=["sudo", "-n", "/bin/launchctl", "bootout", f"system/com.example.{MODEL}"],
    )
    start = StartService(model=m, backend="ring").describe()
    assert start.name == "start-ring" and "--pipeline" in start.description
    assert start.argv == ["sudo", "-n", "/bin/launchctl", "bootstrap", "system",
                          f"/Library/LaunchDaemons/com.example.{MODEL}.plist"]
    assert Sweep(model=m, node="ai003").describe().node == "ai003"
    assert CleanTmp(model=m, node="ai002").describe().targets == [
        f"/Users/ai/.cache/mlx-share/{MODEL}/tmp*"]
    verify = Verify(model=m, backend="jaccl")
    assert verify.kind is StepKind.VERIFY and verify.describe().targets == ["127.0.0.1:8080"]


@pytest.mark.parametrize("step", [
    StopService(model=model()), StartService(model=model(), backend="jaccl"),
    Sweep(model=model(), node="ai002"), CleanTmp(model=model(), node="ai002"),
], ids=lambda step: step.describe().name)
async def test_steps_that_act_on_nodes_say_they_did_nothing(step, tmp_path: Path) -> None:
    result = await step.run(context(Health(), tmp_path))
    assert result.outcome is StepOutcome.NOT_IMPLEMENTED
    assert "nothing was done" in result.detail


@pytest.mark.parametrize(("verdict", "outcome", "backend"), [
    (HealthVerdict.up("completed a 1-token request"), StepOutcome.OK, "jaccl"),
    (HealthVerdict.down("connection refused"), StepOutcome.FAILED, None),
    (HealthVerdict.unknown("could not probe on ai001: timeout"), StepOutcome.INCONCLUSIVE, None),
])
async def test_verify_reads_the_full_verdict_and_could_not_tell_is_not_down(
    verdict: HealthVerdict, outcome: StepOutcome, backend: str | None, tmp_path: Path,
) -> None:
    result = await Verify(model=model(), backend="jaccl").run(
        context(Health(verdicts=[verdict]), tmp_path))
    assert (result.outcome, result.backend) == (outcome, backend)
    assert verdict.reason in result.detail


@pytest.mark.parametrize(("verdict", "expected"), [
    (HealthVerdict.down("refused"), RecheckVerdict.act(f"{MODEL} is still down: refused")),
    (HealthVerdict.up("completed"), RecheckVerdict.skip("model is up again: completed")),
    (HealthVerdict.unknown("busy"),
     RecheckVerdict.skip(f"could not confirm {MODEL} is down: busy", undecided=True)),
])
async def test_recover_acts_only_on_a_model_that_is_still_down(
    verdict: HealthVerdict, expected: RecheckVerdict, tmp_path: Path,
) -> None:
    playbook = RecoverPlaybook()
    assert await playbook.recheck(context(Health(verdicts=[verdict]), tmp_path)) == expected
