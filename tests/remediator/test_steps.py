"""Steps describe themselves (what the dry run and the journal show) and act through the
node helpers: one helper call per node, every node at once; a node that cannot be asked
is named and ends the run in an escalation; the verify step and recover's re-check keep
"could not tell" apart from "down"."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.inventory import Inventory, Model, parse_inventory
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks import RecheckVerdict, RecoverPlaybook
from mlx_medic.remediator.steps import (
    CleanTmp,
    Escalate,
    PinRing,
    Preflight,
    RunContext,
    StartService,
    StepDescription,
    StepKind,
    StopService,
    Sweep,
    Verify,
)
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import MODEL, Health, inventory_text, make_inventory
from tests.remediator.fake_helpers import DEFAULTS, Answer, FakeHelpers, unreachable

INVENTORY = make_inventory(start_timeout="1s")
NODES = ["ai001", "ai002", "ai003", "ai004"]
RANK_IN_D = {"pid": 4242, "start_time": 1.0, "cmdline": ["python", "-m", "mlx_lm.server"],
             "role": "rank", "state": "D"}
JACCL_LINE = "[jaccl] Changing queue pair to RTR failed with errno 16"


def script_inventory() -> Inventory:
    data = yaml.safe_load(inventory_text(Path("/var/lib/mlx-medic")))
    data["models"][MODEL]["service"]["kind"] = "script"
    return parse_inventory(yaml.safe_dump(data))


def model(inventory: Inventory = INVENTORY) -> Model:
    return inventory.model(MODEL)


def context(health: Health, tmp_path: Path, helpers: FakeHelpers | None = None,
            inventory: Inventory = INVENTORY, **extra: Any) -> RunContext:
    return RunContext(model=model(inventory), inventory=inventory,
                      transport=LocalTransport(), run_id=7, health=health,
                      log=logging.getLogger("test"), helpers=helpers, **extra)


def facts(**changes: Any) -> Answer:
    return Answer({**DEFAULTS["facts"], **changes})


def test_each_step_describes_itself_with_its_nodes_targets_and_command() -> None:
    m = model()
    assert StopService(model=m).describe() == StepDescription(
        "stop-service", "ai001",
        f"record on ai001 that this run stops com.example.{MODEL}, then stop the launchd"
        " service so it cannot respawn ranks during the sweep",
        targets=[f"com.example.{MODEL}"],
        argv=["sudo", "-n", "/bin/launchctl", "bootout", f"system/com.example.{MODEL}"],
    )
    start = StartService(model=m).describe()
    assert start.name == "start-service" and "serve wrapper" in start.description
    assert start.argv == ["sudo", "-n", "/bin/launchctl", "bootstrap", "system",
                          f"/Library/LaunchDaemons/com.example.{MODEL}.plist"]
    restart = StartService(model=m, action="restart").describe()
    assert restart.argv == ["sudo", "-n", "/bin/launchctl", "kickstart", "-k",
                            f"system/com.example.{MODEL}"]
    assert Preflight(model=m).describe().targets == NODES
    assert Sweep(model=m).describe().targets == [f"{MODEL} on {n}" for n in NODES]
    assert Sweep(model=m, nodes=("ai003",), orphans_only=True).describe().node == "ai003"
    assert CleanTmp(model=m).describe().targets == [f"/Users/ai/.cache/mlx-share/{MODEL}/tmp*"]
    verify = Verify(model=m, backend="ring")
    assert verify.kind is StepKind.VERIFY and verify.describe().targets == ["127.0.0.1:8080"]
    assert verify.describe().name == "verify-ring" and Verify(model=m).describe().name == "verify"


def test_verify_describes_the_wait_it_will_take() -> None:
    m = model()
    timeout = m.policy.start_timeout
    assert Verify(model=m).describe().description.endswith(
        f"a real 1-token request, asked again for up to {timeout:g}s")
    assert Verify(model=m, within=7).describe().description.endswith("for up to 7s")
    assert Verify(model=m, within=0).describe().description.endswith(
        "a real 1-token request, asked once")


def test_recover_plans_a_ring_pin_only_for_a_serve_wrapper_with_both_backends() -> None:
    wrapper = [s.describe().name for s in RecoverPlaybook().plan(model(), INVENTORY)]
    assert wrapper == ["preflight", "stop-service", "sweep", "clean-tmp", "start-service",
                       "verify", "pin-ring", "restart-service", "verify-ring", "escalate"]
    inventory = script_inventory()
    script = RecoverPlaybook().plan(model(inventory), inventory)
    assert [s.describe().name for s in script] == [
        "preflight", "stop-service", "sweep", "clean-tmp", "start-service", "verify",
        "escalate"]
    assert [s.fallback for s in script][-1] is True


async def test_preflight_asks_every_node_for_its_facts_and_reads_memory_and_rdma(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai003", "facts"): facts(
        rdma={"ports": [{"device": "rdma_en3", "port": 1, "state": "PORT_DOWN",
                         "active": False}]})})
    result = await Preflight(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert sorted(helpers.of("facts")) == [(n, (MODEL,)) for n in NODES]
    assert "ai001: memory 64.0 GiB free, 1 RDMA port(s) active" in result.detail
    assert "ai003: memory 64.0 GiB free, RDMA ports not active: rdma_en3:1" in result.detail
    assert '"node": "ai002"' in result.output  # each node's document is journaled


@pytest.mark.parametrize(("port", "said"), [
    ({"state": "PORT_ACTIVE", "active": False}, "RDMA ports not active: rdma_en3:1"),
    ({"state": "PORT_DOWN", "active": True}, "1 RDMA port(s) active"),
    ({"state": "PORT_ACTIVE"}, "RDMA port(s) of unknown state: rdma_en3:1"),
], ids=["helper-says-inactive", "helper-says-active", "helper-does-not-say"])
async def test_preflight_takes_the_helpers_word_on_whether_a_port_is_active(
    port: dict[str, Any], said: str, tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai003", "facts"): facts(
        rdma={"ports": [{"device": "rdma_en3", "port": 1, **port}]})})
    result = await Preflight(model=model()).run(context(Health(), tmp_path, helpers))
    assert f"ai003: memory 64.0 GiB free, {said}" in result.detail


async def test_an_unreachable_node_at_preflight_escalates_naming_it(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai002", "facts"): unreachable("ai002", "facts")})
    result = await Preflight(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.UNREACHABLE and result.unrecoverable
    assert result.unreachable == ("ai002",)
    assert result.detail.startswith("ai002 did not answer the preflight")
    assert result.next_action is not None
    assert "nothing was stopped or restarted" in result.next_action
    assert "Check that ai002 is up" in result.next_action


async def test_stop_asks_the_head_to_record_the_run_and_stop_the_service(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY)
    result = await StopService(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK and result.exit_status == 0
    ((node, args),) = helpers.of("service")
    assert node == "ai001"
    assert args[:5] == (MODEL, "stop", "--by", "remediator run 7", "--reason")


async def test_a_stop_the_service_manager_refused_fails_the_step_with_its_words(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai001", "service"): Answer(
        {"exit_status": 1, "stderr": "sudo: a password is required"}, exit_status=1)})
    result = await StopService(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and not result.unrecoverable
    assert "sudo: a password is required" in result.detail and result.exit_status == 1


async def test_sweep_runs_on_every_node_and_counts_what_each_signalled(tmp_path: Path) -> None:
    signalled = {"pid": 9, "start_time": 1.0, "cmdline": ["x"], "role": "rank", "rule": "",
                 "signals": ["SIGTERM"]}
    helpers = FakeHelpers(INVENTORY, {("ai002", "sweep"): Answer(
        {**DEFAULTS["sweep"], "signalled": [signalled], "pd_spent": 1})})
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert sorted(helpers.of("sweep")) == [(n, (MODEL,)) for n in NODES]
    assert "ai002: 1 signalled, 0 spared, 1 PD spent" in result.detail


async def test_unkillable_survivors_escalate_naming_the_node_to_reboot_with_its_facts(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {
        ("ai003", "sweep"): Answer({**DEFAULTS["sweep"], "survivors": [RANK_IN_D],
                                    "unkillable": [RANK_IN_D], "complete": False},
                                   exit_status=1),
        ("ai003", "facts"): facts(log_errors=[{"signature": "jaccl_qp_rtr_errno_16",
                                           "line": JACCL_LINE}]),
    })
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.UNKILLABLE and result.unrecoverable
    assert result.next_action is not None and result.next_action.startswith("reboot ai003 ")
    assert "pid 4242 (rank, state D)" in result.detail
    assert "ai003: OS build 24G84, mlx 0.29.1, mlx-lm 0.28.0" in result.detail
    assert f"error on ai003: {JACCL_LINE}" in result.detail
    assert helpers.of("facts") == [("ai003", (MODEL,))]  # only the node to reboot


async def test_survivors_a_sweep_may_not_kill_fail_the_step(tmp_path: Path) -> None:
    survivor = {**RANK_IN_D, "state": "S"}
    helpers = FakeHelpers(INVENTORY, {("ai002", "sweep"): Answer(
        {**DEFAULTS["sweep"], "survivors": [survivor], "complete": False}, exit_status=1,
        stderr="mlx-medic node sweep: pid 4242 (rank) survives the sweep on node ai002")})
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and not result.unrecoverable
    assert "pid 4242 (rank) survives the sweep on node ai002" in result.detail


async def test_sweep_orphans_only_asks_the_named_nodes(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY)
    step = Sweep(model=model(), nodes=("ai002",), orphans_only=True)
    assert (await step.run(context(Health(), tmp_path, helpers))).outcome is StepOutcome.OK
    assert helpers.of("sweep") == [("ai002", (MODEL, "--orphans-only"))]


async def test_clean_runs_on_every_node_and_reports_bytes_freed(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai004", "clean"): Answer(
        {"removed": [{"path": "/x/tmpab", "bytes": 4096, "kind": "dir"}], "bytes_freed": 4096,
         "skipped": []})})
    result = await CleanTmp(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert sorted(helpers.of("clean")) == [(n, (MODEL,)) for n in NODES]
    assert "ai004: 1 removed, 4096 bytes freed" in result.detail


async def test_start_lets_go_of_the_model_lock_before_it_starts_the_service(
    tmp_path: Path,
) -> None:
    order: list[str] = []

    async def release() -> None:
        order.append("release")

    helpers = FakeHelpers(INVENTORY, on_call=lambda node, helper, args: order.append(
        f"{helper} {args[1]} on {node}"))
    result = await StartService(model=model()).run(
        context(Health(), tmp_path, helpers, release_lock=release))
    assert result.outcome is StepOutcome.OK
    assert order == ["release", "service start on ai001"]


async def test_verify_asks_again_until_the_model_answers() -> None:
    health = Health(verdicts=[HealthVerdict.down("refused"), HealthVerdict.down("refused"),
                              HealthVerdict.up("completed a 1-token request")])
    result = await Verify(model=model(), poll_interval=0.01).run(context(health, Path("/")))
    assert result.outcome is StepOutcome.OK and health.calls == 3


@pytest.mark.parametrize(("verdict", "outcome", "backend"), [
    (HealthVerdict.up("completed a 1-token request"), StepOutcome.OK, "jaccl"),
    (HealthVerdict.down("connection refused"), StepOutcome.FAILED, None),
    (HealthVerdict.unknown("could not probe on ai001: timeout"), StepOutcome.INCONCLUSIVE, None),
])
async def test_verify_reads_the_full_verdict_and_could_not_tell_is_not_down(
    verdict: HealthVerdict, outcome: StepOutcome, backend: str | None, tmp_path: Path,
) -> None:
    health = Health(verdicts=[verdict] * 1000)
    result = await Verify(model=model(), backend="jaccl", poll_interval=0.3).run(
        context(health, tmp_path))
    assert (result.outcome, result.backend) == (outcome, backend)
    assert verdict.reason in result.detail


@pytest.mark.parametrize("evidence", [
    {"log_errors": [{"signature": "jaccl_qp_rtr_errno_16", "line": JACCL_LINE}]},
    {"serve": {"state": "failed", "backend": "jaccl", "failure": {
        "backend": "jaccl", "host": "ai002", "reason": "smoke test failed",
        "line": JACCL_LINE}}},
], ids=["service-log", "wrapper-record"])
async def test_a_jaccl_failure_pins_ring_on_the_head_with_the_line_as_the_reason(
    evidence: dict[str, Any], tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai001", "facts"): facts(**evidence)})
    result = await PinRing(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    ((node, args),) = helpers.of("backend")
    host = "ai002" if "serve" in evidence else "ai001"
    assert (node, args) == ("ai001", (MODEL, "set", "ring", "--by", "remediator run 7",
                                      "--reason", f"JACCL failed on {host}: {JACCL_LINE}"))


async def test_without_a_jaccl_failure_no_pin_is_made_and_the_run_escalates(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai001", "facts"): facts(log_errors=[
        {"signature": "metal_out_of_memory", "line": "kIOGPUCommandBufferCallbackError"}])})
    result = await PinRing(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert "a ring pin would not help" in result.detail
    assert "error on ai001: kIOGPUCommandBufferCallbackError" in result.detail
    assert helpers.of("backend") == []


async def test_escalate_for_a_start_script_says_a_pin_changes_nothing(tmp_path: Path) -> None:
    inventory = script_inventory()
    helpers = FakeHelpers(inventory)
    result = await Escalate(model=model(inventory)).run(
        context(Health(), tmp_path, helpers, inventory=inventory))
    assert result.unrecoverable
    assert "a backend pin changes nothing" in result.detail
    assert "ai004: OS build 24G84, mlx 0.29.1, mlx-lm 0.28.0" in result.detail
    assert result.next_action is not None and "reboot all its nodes" in result.next_action


async def test_escalate_names_a_node_that_gave_no_facts(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai004", "facts"): unreachable("ai004", "facts")})
    result = await Escalate(model=model()).run(context(Health(), tmp_path, helpers))
    assert "ai004: no facts (did not answer)" in result.detail


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


async def test_a_node_that_answers_without_a_helper_document_is_told_apart_from_a_silent_one(
    tmp_path: Path,
) -> None:
    from mlx_medic.node.client import HelperCallError

    missing = HelperCallError("ai002", "facts", "exit 2, no helper document: invalid choice")
    helpers = FakeHelpers(INVENTORY, {("ai002", "facts"): missing})
    result = await Preflight(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert result.unreachable == ()
    assert result.detail.startswith("ai002 gave no helper document for the preflight")
    assert result.next_action is not None
    assert result.next_action.startswith("run `mlx-medic node facts` on ai002 by hand")
