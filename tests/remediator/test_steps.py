"""Steps describe themselves (what the dry run and the journal show) and act through the
node helpers: one helper call per node, every node at once; a node that cannot be asked
is named and ends the run in an escalation; what a sweep cannot end (uninterruptible) is
named with the node to reboot and ends it ok, while a survivor a sweep could have ended
fails it; an escalation carries the survivors' reboot advice; the verify step and
recover's re-check keep "could not tell" apart from "down"."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.processes.survivors import Survivor, SurvivorVerdict
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.playbooks import RecheckVerdict, RecoverPlaybook
from mlx_medic.remediator.steps import (
    CleanTmp,
    Escalate,
    PinRing,
    Preflight,
    RunContext,
    StartMarks,
    StartService,
    StepDescription,
    StepKind,
    StopService,
    Sweep,
    Verify,
    describe_plan,
)
from mlx_medic.remediator.steps.sweep import survivor_escalation
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import MODEL, Health, inventory_text, make_inventory
from tests.remediator.fake_helpers import (
    DEFAULTS,
    Answer,
    FakeHelpers,
    stuck,
    swept,
    unreachable,
)

INVENTORY = make_inventory(start_timeout="1s")
NODES = ["ai001", "ai002", "ai003", "ai004"]
RANK_IN_D = {
    "pid": 4242,
    "start_time": 1.0,
    "cmdline": ["python", "-m", "mlx_lm.server"],
    "role": "rank",
    "state": "D",
}
JACCL_LINE = "[jaccl] Changing queue pair to RTR failed with errno 16"


def script_inventory() -> Inventory:
    data = yaml.safe_load(inventory_text(Path("/var/lib/mlx-medic")))
    data["models"][MODEL]["service"]["kind"] = "script"
    return parse_inventory(yaml.safe_dump(data))


def model(inventory: Inventory = INVENTORY) -> Model:
    return inventory.model(MODEL)


def supervisord_inventory(**service: Any) -> Inventory:
    data = yaml.safe_load(inventory_text(Path("/var/lib/mlx-medic")))
    data["models"][MODEL]["service"] = {"manager": "supervisord", "label": "m", **service}
    return parse_inventory(yaml.safe_dump(data))


def context(
    health: Health,
    tmp_path: Path,
    helpers: FakeHelpers | None = None,
    inventory: Inventory = INVENTORY,
    **extra: Any,
) -> RunContext:
    return RunContext(
        model=model(inventory),
        inventory=inventory,
        transport=LocalTransport(),
        run_id=7,
        health=health,
        log=logging.getLogger("test"),
        helpers=helpers,
        **extra,
    )


def facts(**changes: Any) -> Answer:
    return Answer({**DEFAULTS["facts"], **changes})


def test_each_step_describes_itself_with_its_nodes_targets_and_command() -> None:
    m = model()
    assert StopService(model=m).describe() == StepDescription(
        "stop-service",
        "ai001",
        f"record on ai001 that this run stops com.example.{MODEL}, then stop the launchd"
        " service so it cannot respawn ranks during the sweep",
        targets=[f"com.example.{MODEL}"],
        argv=["sudo", "-n", "/bin/launchctl", "bootout", f"system/com.example.{MODEL}"],
    )
    start = StartService(model=m).describe()
    assert start.name == "start-service" and "serve wrapper" in start.description
    assert start.argv == [
        "sudo",
        "-n",
        "/bin/launchctl",
        "bootstrap",
        "system",
        f"/Library/LaunchDaemons/com.example.{MODEL}.plist",
    ]
    restart = StartService(model=m, action="restart").describe()
    assert restart.argv == [
        "sudo",
        "-n",
        "/bin/launchctl",
        "kickstart",
        "-k",
        f"system/com.example.{MODEL}",
    ]
    assert Preflight(model=m).describe().targets == NODES
    assert Sweep(model=m).describe().targets == [f"{MODEL} on {n}" for n in NODES]
    assert Sweep(model=m, nodes=("ai003",), orphans_only=True).describe().node == "ai003"
    assert CleanTmp(model=m).describe().targets == [f"/Users/ai/.cache/mlx-share/{MODEL}/tmp*"]
    verify = Verify(model=m, backend="ring")
    assert verify.kind is StepKind.VERIFY and verify.describe().targets == ["127.0.0.1:8080"]
    assert verify.describe().name == "verify-ring" and Verify(model=m).describe().name == "verify"


def test_a_supervisord_service_step_says_when_the_head_asks_over_its_socket() -> None:
    """The journal's command is supervisorctl's; the head makes its calls over the socket
    when the config names one (node service_cli.supervisord_socket)."""
    asked = model(supervisord_inventory(config="/etc/supervisord.conf"))
    stop = StopService(model=asked).describe()
    assert stop.argv == ["supervisorctl", "-c", "/etc/supervisord.conf", "stop", "m"]
    assert "over the socket its config's [supervisorctl] section names" in stop.description
    assert "over the socket" in StartService(model=asked).describe().description
    for service in ({}, {"config": "/etc/supervisord.conf", "sudo": True}):
        ran = model(supervisord_inventory(**service))
        assert "socket" not in StopService(model=ran).describe().description
        assert "socket" not in StartService(model=ran).describe().description


def test_verify_describes_the_wait_it_will_take() -> None:
    m = model()
    timeout = m.policy.start_timeout
    assert (
        Verify(model=m)
        .describe()
        .description.endswith(f"a real 1-token request, asked again for up to {timeout:g}s")
    )
    assert Verify(model=m, within=7).describe().description.endswith("for up to 7s")
    assert (
        Verify(model=m, within=0)
        .describe()
        .description.endswith("a real 1-token request, asked once")
    )


def test_recover_plans_a_ring_pin_only_for_a_serve_wrapper_with_both_backends() -> None:
    wrapper = [s.describe().name for s in RecoverPlaybook().plan(model(), INVENTORY)]
    assert wrapper == [
        "preflight",
        "stop-service",
        "sweep",
        "clean-tmp",
        "start-service",
        "verify",
        "pin-ring",
        "restart-service",
        "verify-ring",
        "escalate",
    ]
    inventory = script_inventory()
    script = RecoverPlaybook().plan(model(inventory), inventory)
    assert [s.describe().name for s in script] == [
        "preflight",
        "stop-service",
        "sweep",
        "clean-tmp",
        "start-service",
        "verify",
        "escalate",
    ]
    assert [s.fallback for s in script][-1] is True


async def test_preflight_asks_every_node_for_its_facts_and_reads_memory_and_rdma(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai003", "facts"): facts(
                rdma={
                    "ports": [
                        {"device": "rdma_en3", "port": 1, "state": "PORT_DOWN", "active": False}
                    ]
                }
            )
        },
    )
    result = await Preflight(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert sorted(helpers.of("facts")) == [(n, (MODEL,)) for n in NODES]
    assert "ai001: memory 64.0 GiB free, 1 RDMA port(s) active" in result.detail
    assert "ai003: memory 64.0 GiB free, RDMA ports not active: rdma_en3:1" in result.detail
    assert '"node": "ai002"' in result.output  # each node's document is journaled


@pytest.mark.parametrize(
    ("port", "said"),
    [
        ({"state": "PORT_ACTIVE", "active": False}, "RDMA ports not active: rdma_en3:1"),
        ({"state": "PORT_DOWN", "active": True}, "1 RDMA port(s) active"),
        ({"state": "PORT_ACTIVE"}, "RDMA port(s) of unknown state: rdma_en3:1"),
    ],
    ids=["helper-says-inactive", "helper-says-active", "helper-does-not-say"],
)
async def test_preflight_takes_the_helpers_word_on_whether_a_port_is_active(
    port: dict[str, Any],
    said: str,
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {("ai003", "facts"): facts(rdma={"ports": [{"device": "rdma_en3", "port": 1, **port}]})},
    )
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
    replica = context(Health(), tmp_path, helpers, host="medic-a", pid=4242)
    result = await StopService(model=model()).run(replica)
    assert result.outcome is StepOutcome.OK and result.exit_status == 0
    ((node, args),) = helpers.of("service")
    assert node == "ai001"
    # the record names the replica too: two replicas' journals number their runs alike
    by = "remediator run 7 (pid 4242 on medic-a)"
    assert args[:5] == (MODEL, "stop", "--by", by, "--reason")
    assert result.detail == f"stop {model().service.label}: done"


async def test_a_stop_that_finds_another_runs_record_journals_whose_it_was(
    tmp_path: Path,
) -> None:
    killed = {"run": "remediator run 3 (pid 99 on medic-b)", "at": 0.0, "reason": "down"}
    stopped = Answer({**DEFAULTS["service"], "replaced": killed})
    helpers = FakeHelpers(INVENTORY, {("ai001", "service"): stopped})
    result = await StopService(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert result.detail == (
        f"stop {model().service.label}: done; found it stopped by remediator run 3"
        " (pid 99 on medic-b) since 1970-01-01T00:00:00Z (down): this run sweeps, starts"
        " and clears it"
    )


async def test_a_stop_the_service_manager_refused_fails_the_step_with_its_words(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai001", "service"): Answer(
                {"exit_status": 1, "stderr": "sudo: a password is required"}, exit_status=1
            )
        },
    )
    result = await StopService(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and not result.unrecoverable
    assert "sudo: a password is required" in result.detail and result.exit_status == 1


async def test_sweep_runs_on_every_node_and_counts_what_each_signalled(tmp_path: Path) -> None:
    signalled = {
        "pid": 9,
        "start_time": 1.0,
        "cmdline": ["x"],
        "role": "rank",
        "rule": "",
        "signals": ["SIGTERM"],
    }
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai002", "sweep"): Answer(
                {**DEFAULTS["sweep"], "signalled": [signalled], "pd_spent": 1}
            )
        },
    )
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    assert sorted(helpers.of("sweep")) == [(n, (MODEL,)) for n in NODES]
    assert "ai002: 1 signalled, 0 spared, 1 PD spent" in result.detail


ADVICE = f"reboot ai003 to free 1 protection domain(s) (models placed there: {MODEL})"
NAMED = (
    "ai003: pid 4242 (rank, state uninterruptible, holding 1 protection domain(s) on"
    " rdma_en2) survives SIGKILL: python -m mlx_lm.server"
)


@pytest.mark.parametrize(
    "answer",
    [
        swept(stuck(4242)),
        Answer(
            {
                **DEFAULTS["sweep"],
                "survivors": [RANK_IN_D],
                "unkillable": [RANK_IN_D],
                "complete": False,
            },
            exit_status=1,
        ),
    ],
    ids=["settled", "helper-before-settled"],
)
async def test_unkillable_survivors_end_the_sweep_ok_named_with_the_node_to_reboot(
    answer: Answer,
    tmp_path: Path,
) -> None:
    """The seed's fix: what only a reboot ends is named, and the start goes on around it;
    a helper from before `settled` (exit 1 for any survivor) reads the same."""
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai003", "sweep"): answer,
            ("ai003", "facts"): facts(
                log_errors=[{"signature": "jaccl_qp_rtr_errno_16", "line": JACCL_LINE}]
            ),
        },
    )
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK and not result.unrecoverable
    assert result.next_action is None
    assert result.survivors is not None
    assert [(s.node, s.pid, s.start_time) for s in result.survivors.survivors] == [
        ("ai003", 4242, 1.0)
    ]
    assert result.unkillable == {"ai001": [], "ai002": [], "ai003": [(4242, 1.0)], "ai004": []}
    assert "ai003: 0 signalled, 0 spared, 0 PD spent" in result.detail
    assert "1 survivor(s) that only a reboot of its node ends: ai003: pid 4242" in result.detail
    assert "the start goes on around them" in result.detail
    assert "ai003: OS build 24G84, mlx 0.29.1, mlx-lm 0.28.0" in result.detail
    assert f"error on ai003: {JACCL_LINE}" in result.detail
    assert helpers.of("facts") == [("ai003", (MODEL,))]  # only the node to reboot
    if answer.exit_status == 0:
        assert f"{NAMED}. {ADVICE}; the start goes on around them" in result.detail


async def test_a_survivor_holding_the_port_ends_the_sweep_ok_with_its_reboot_as_next_action(
    tmp_path: Path,
) -> None:
    """The start still happens (the service is never left stopped by a survivor); its
    verify will fail until the head reboots, and the step says so."""
    helpers = FakeHelpers(INVENTORY, {("ai001", "sweep"): swept(stuck(4242, holds_port=True))})
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK and not result.unrecoverable
    assert result.survivors is not None and result.survivors.blocked
    advice = f"reboot ai001 to free 1 protection domain(s) (models placed there: {MODEL})"
    assert result.next_action == (
        f"{advice}: a process there that survives SIGKILL holds {MODEL}'s port, so no start"
        f" can listen on it until then; com.example.{MODEL} is left started and serves once"
        " the port is free"
    )
    assert (
        f"One holds {MODEL}'s port, so no start can listen there until ai001 reboots; the"
        " start goes on anyway (a survivor never leaves the service stopped" in result.detail
    )
    assert f"so its verify fails until then; next action: {advice}" in result.detail


async def test_survivors_a_sweep_may_not_kill_fail_the_step(tmp_path: Path) -> None:
    survivor = {**RANK_IN_D, "state": "S"}
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai002", "sweep"): Answer(
                {**DEFAULTS["sweep"], "survivors": [survivor], "complete": False, "settled": False},
                exit_status=1,
                stderr="mlx-medic node sweep: pid 4242 (rank) survives the sweep on node ai002",
            )
        },
    )
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and not result.unrecoverable
    assert (
        "ai002: pid 4242 (rank, state S) survived the sweep, not in uninterruptible"
        " sleep" in result.detail
    )
    assert result.survivors is None


async def test_a_sweep_helper_that_failed_with_no_survivor_fails_the_step(tmp_path: Path) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai004", "sweep"): Answer(
                {**DEFAULTS["sweep"], "settled": False},
                exit_status=1,
                stderr="mlx-medic node sweep: cannot read /proc: permission denied",
            )
        },
    )
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED
    assert "ai004: mlx-medic node sweep: mlx-medic node sweep: cannot read /proc" in result.detail


def test_the_sweep_says_what_survivors_mean_before_it_runs() -> None:
    sweep = Sweep(model=model()).describe().description
    assert sweep.endswith(
        "what survives SIGKILL (state D/U) is named with the node to reboot,"
        " and the start goes on around them (one holding :8080 makes the"
        " start fail until that reboot)"
    )
    orphans = Sweep(model=model(), nodes=("ai002",), orphans_only=True).describe().description
    assert orphans.endswith("named once with the node to reboot, and the model keeps serving")


async def test_a_killable_survivor_beside_an_unkillable_one_fails_the_step_naming_both(
    tmp_path: Path,
) -> None:
    sleeping = {**RANK_IN_D, "pid": 4343, "state": "sleeping"}
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai003", "sweep"): swept(
                stuck(4242),
                killable=(sleeping,),
                stderr="mlx-medic node sweep: pid 4343 (rank) survives the sweep on node ai003",
            )
        },
    )
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and not result.unrecoverable
    assert "ai003: pid 4343 (rank, state sleeping) survived the sweep" in result.detail
    assert f"also 1 survivor(s) that only a reboot of its node ends: {NAMED}" in result.detail
    assert result.survivors is not None and result.unkillable is not None
    assert result.unkillable["ai003"] == [(4242, 1.0)]


async def test_sweep_orphans_names_a_survivor_once_and_counts_those_named_before(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai003", "sweep"): swept(stuck(4242), stuck(4343))})
    step = Sweep(model=model(), nodes=("ai003",), orphans_only=True)
    known = frozenset({("ai003", 4343, 1.0)})
    result = await step.run(context(Health(), tmp_path, helpers, known_unkillable=known))
    assert result.outcome is StepOutcome.OK and result.next_action is None
    assert result.survivors is not None
    assert [s.pid for s in result.survivors.survivors] == [4242]  # the new one only
    assert result.unkillable == {"ai003": [(4242, 1.0), (4343, 1.0)]}  # the gauge: both
    assert "1 unkillable process(es) an earlier run named, left alone" in result.detail
    assert f"{NAMED}. {ADVICE}; the model keeps serving" in result.detail
    assert "pid 4343" not in result.detail


async def test_sweep_orphans_only_asks_the_named_nodes(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY)
    step = Sweep(model=model(), nodes=("ai002",), orphans_only=True)
    assert (await step.run(context(Health(), tmp_path, helpers))).outcome is StepOutcome.OK
    assert helpers.of("sweep") == [("ai002", (MODEL, "--orphans-only"))]


async def test_clean_runs_on_every_node_and_reports_bytes_freed(tmp_path: Path) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai004", "clean"): Answer(
                {
                    "removed": [{"path": "/x/tmpab", "bytes": 4096, "kind": "dir"}],
                    "bytes_freed": 4096,
                    "skipped": [],
                }
            )
        },
    )
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

    helpers = FakeHelpers(
        INVENTORY, on_call=lambda node, helper, args: order.append(f"{helper} {args[1]} on {node}")
    )
    result = await StartService(model=model()).run(
        context(Health(), tmp_path, helpers, release_lock=release)
    )
    assert result.outcome is StepOutcome.OK
    assert order == ["release", "service start on ai001"]


async def test_verify_asks_again_until_the_model_answers() -> None:
    health = Health(
        verdicts=[
            HealthVerdict.down("refused"),
            HealthVerdict.down("refused"),
            HealthVerdict.up("completed a 1-token request"),
        ]
    )
    result = await Verify(model=model(), poll_interval=0.01).run(context(health, Path("/")))
    assert result.outcome is StepOutcome.OK and health.calls == 3


@pytest.mark.parametrize(
    ("verdict", "outcome", "backend"),
    [
        (HealthVerdict.up("completed a 1-token request"), StepOutcome.OK, "jaccl"),
        (HealthVerdict.down("connection refused"), StepOutcome.FAILED, None),
        (
            HealthVerdict.unknown("could not probe on ai001: timeout"),
            StepOutcome.INCONCLUSIVE,
            None,
        ),
    ],
)
async def test_verify_reads_the_full_verdict_and_could_not_tell_is_not_down(
    verdict: HealthVerdict,
    outcome: StepOutcome,
    backend: str | None,
    tmp_path: Path,
) -> None:
    health = Health(verdicts=[verdict] * 1000)
    result = await Verify(model=model(), backend="jaccl", poll_interval=0.3).run(
        context(health, tmp_path)
    )
    assert (result.outcome, result.backend) == (outcome, backend)
    assert verdict.reason in result.detail


@pytest.mark.parametrize(
    "evidence",
    [
        {"log_errors": [{"signature": "jaccl_qp_rtr_errno_16", "line": JACCL_LINE}]},
        {
            "serve": {
                "state": "failed",
                "backend": "jaccl",
                "failure": {
                    "backend": "jaccl",
                    "host": "ai002",
                    "reason": "smoke test failed",
                    "line": JACCL_LINE,
                },
            }
        },
    ],
    ids=["service-log", "wrapper-record"],
)
async def test_a_jaccl_failure_pins_ring_on_the_head_with_the_line_as_the_reason(
    evidence: dict[str, Any],
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai001", "facts"): facts(**evidence)})
    result = await PinRing(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.OK
    ((node, args),) = helpers.of("backend")
    host = "ai002" if "serve" in evidence else "ai001"
    assert (node, args) == (
        "ai001",
        (
            MODEL,
            "set",
            "ring",
            "--by",
            "remediator run 7",
            "--reason",
            f"JACCL failed on {host}: {JACCL_LINE}",
        ),
    )


async def test_without_a_jaccl_failure_no_pin_is_made_and_the_run_escalates(
    tmp_path: Path,
) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai001", "facts"): facts(
                log_errors=[
                    {"signature": "metal_out_of_memory", "line": "kIOGPUCommandBufferCallbackError"}
                ]
            )
        },
    )
    result = await PinRing(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert "a ring pin would not help" in result.detail
    assert "error on ai001: kIOGPUCommandBufferCallbackError" in result.detail
    assert helpers.of("backend") == []


async def test_escalate_for_a_start_script_says_a_pin_changes_nothing(tmp_path: Path) -> None:
    inventory = script_inventory()
    helpers = FakeHelpers(inventory)
    result = await Escalate(model=model(inventory)).run(
        context(Health(), tmp_path, helpers, inventory=inventory)
    )
    assert result.unrecoverable
    assert "a backend pin changes nothing" in result.detail
    assert "ai004: OS build 24G84, mlx 0.29.1, mlx-lm 0.28.0" in result.detail
    assert result.next_action is not None and "reboot all its nodes" in result.next_action


def survivors(*entries: tuple[str, dict[str, Any]]) -> SurvivorVerdict:
    """What a sweep left, as the engine keeps it in the run's context: (node, entry)."""
    return SurvivorVerdict(MODEL, [Survivor.from_json(node, MODEL, e) for node, e in entries])


async def test_escalate_names_the_survivors_and_puts_their_reboot_first(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY)
    result = await Escalate(model=model()).run(
        context(Health(), tmp_path, helpers, survivors=survivors(("ai002", stuck(77))))
    )
    assert result.unrecoverable
    assert result.detail.startswith(f"every backend of {MODEL} failed verification.")
    assert "survivors left: ai002: pid 77 (rank, state uninterruptible" in result.detail
    assert result.next_action == (
        f"reboot ai002 to free 1 protection domain(s) (models placed there: {MODEL}), then"
        f" stop every rank of {MODEL}, check the Thunderbolt links (`ibv_devinfo`:"
        " PORT_ACTIVE), reboot all its nodes (ai001, ai002, ai003, ai004)"
    )


async def test_a_survivor_holding_the_port_is_why_no_pin_is_made(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY)
    held = survivors(("ai001", stuck(77, holds_port=True)), ("ai004", stuck(78)))
    result = await PinRing(model=model()).run(context(Health(), tmp_path, helpers, survivors=held))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert helpers.calls == []  # no facts read, no pin made
    assert "no pin was made" in result.detail
    assert result.next_action is not None
    assert result.next_action.startswith(
        f"reboot ai001 to free 1 protection domain(s) (models placed there: {MODEL}): a"
        f" process there that survives SIGKILL holds {MODEL}'s port"
    )
    assert result.next_action.endswith(
        f"; also reboot ai004 to free 1 protection domain(s) (models placed there: {MODEL},"
        " qwq-32b-8bit)"
    )


@pytest.mark.parametrize(
    ("held", "after_start", "action"),
    [
        (
            False,
            True,
            f"reboot ai002 to free 1 protection domain(s) (models placed there: {MODEL}),"
            " then check it",
        ),
        (
            False,
            False,
            f"check it; also reboot ai002 to free 1 protection domain(s) (models placed"
            f" there: {MODEL})",
        ),
        (
            True,
            True,
            f"reboot ai002 to free 1 protection domain(s) (models placed there: {MODEL}):"
            f" a process there that survives SIGKILL holds {MODEL}'s port, so no start"
            f" can listen on it until then; com.example.{MODEL} is left started and"
            " serves once the port is free",
        ),
        (
            True,
            False,
            f"check it; also reboot ai002 to free 1 protection domain(s) (models placed"
            f" there: {MODEL})",
        ),
    ],
    ids=["after-a-start", "before-a-start", "port-held-after-a-start", "port-held-before"],
)
def test_an_escalation_of_a_run_with_survivors_carries_their_reboot_once(
    held: bool,
    after_start: bool,
    action: str,
) -> None:
    verdict = survivors(("ai002", stuck(77, holds_port=held)))
    detail, next_action = survivor_escalation(
        verdict, INVENTORY, "it failed", "check it", after_start=after_start
    )
    assert next_action == action
    assert detail.startswith("it failed; survivors left: ai002: pid 77 (rank, state")
    assert survivor_escalation(
        verdict, INVENTORY, detail, next_action, after_start=after_start
    ) == (detail, next_action)
    assert survivor_escalation(
        None, INVENTORY, "it failed", "check it", after_start=after_start
    ) == ("it failed", "check it")


async def test_escalate_names_a_node_that_gave_no_facts(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai004", "facts"): unreachable("ai004", "facts")})
    result = await Escalate(model=model()).run(context(Health(), tmp_path, helpers))
    assert "ai004: no facts (did not answer)" in result.detail


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        (HealthVerdict.down("refused"), RecheckVerdict.act(f"{MODEL} is still down: refused")),
        (HealthVerdict.up("completed"), RecheckVerdict.skip("model is up again: completed")),
        (
            HealthVerdict.unknown("busy"),
            RecheckVerdict.skip(f"could not confirm {MODEL} is down: busy", undecided=True),
        ),
    ],
)
async def test_recover_acts_only_on_a_model_that_is_still_down(
    verdict: HealthVerdict,
    expected: RecheckVerdict,
    tmp_path: Path,
) -> None:
    playbook = RecoverPlaybook()
    assert await playbook.recheck(context(Health(verdicts=[verdict]), tmp_path)) == expected


async def test_the_recheck_journals_its_verdict_with_what_was_probed_and_from_where(
    tmp_path: Path,
) -> None:
    probed = "192.168.101.1:8080 from this remediator's host"
    down = HealthVerdict.down("connection refused").probed_as(probed)
    acts = await RecoverPlaybook().recheck(context(Health(verdicts=[down]), tmp_path))
    assert acts.journaled() == f"act: {MODEL} is still down: connection refused (probed {probed})"
    busy = HealthVerdict.unknown("probe busy").probed_as(probed)
    undecided = await RecoverPlaybook().recheck(context(Health(verdicts=[busy]), tmp_path))
    said = f"could not confirm {MODEL} is down: probe busy (probed {probed})"
    assert undecided.journaled() == f"skip, undecided: {said}"
    assert undecided.journaled(dry_run=True) == f"not checked (a dry run plans anyway): {said}"


def test_a_fallback_step_says_it_runs_only_if_the_verify_before_it_fails() -> None:
    plan = describe_plan(RecoverPlaybook().plan(model(), INVENTORY))
    assert [(about.name, about.condition) for about in plan] == [
        ("preflight", None),
        ("stop-service", None),
        ("sweep", None),
        ("clean-tmp", None),
        ("start-service", None),
        ("verify", None),
        ("pin-ring", "only if the start fails verification"),
        ("restart-service", "only if the start fails verification"),
        ("verify-ring", "only if the start fails verification"),
        ("escalate", "only if the start on ring fails verification"),
    ]


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


async def test_a_helper_that_timed_out_is_told_apart_from_a_silent_or_garbled_one(
    tmp_path: Path,
) -> None:
    from mlx_medic.node.client import HelperTimedOut

    hung = HelperTimedOut("ai002", "sweep", 10.0)
    helpers = FakeHelpers(INVENTORY, {("ai002", "sweep"): hung})
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert result.unreachable == () and result.misconfigured == ()
    assert result.detail.startswith(
        "ai002 timed out in the sweep: ai002: mlx-medic node sweep: no answer within 10s"
    )
    assert result.next_action is not None
    assert result.next_action.startswith(
        "`mlx-medic node sweep` on ai002 gave no answer within 10s and ends itself"
    )
    (entry,) = [json.loads(line) for line in result.output.splitlines() if "ai002" in line]
    assert entry["timed_out"] and not entry["unreachable"]  # the journal's output says so


async def test_a_sweep_document_without_a_pid_escalates_naming_the_node_and_field(
    tmp_path: Path,
) -> None:
    garbage = Answer({**DEFAULTS["sweep"], "unkillable": [{"state": "D"}]}, exit_status=1)
    helpers = FakeHelpers(INVENTORY, {("ai003", "sweep"): garbage})
    result = await Sweep(model=model()).run(context(Health(), tmp_path, helpers))
    assert result.outcome is StepOutcome.FAILED and result.unrecoverable
    assert result.detail.startswith("ai003 gave no helper document for the sweep")
    assert "ai003: mlx-medic node sweep: exit 1, the document's unkillable[0].pid" in result.detail
    assert '"node": "ai003"' in result.output  # named in the journal's output too


SERVICE_LOG = "/Users/ai/logs/service.log"
PD_LINE = "RuntimeError: [jaccl] Couldn't allocate protection domain"
BEFORE_START = StartMarks({SERVICE_LOG: 1000}, failed_starts=4)


def pd_error_at(offset: int, size: int = 4096) -> Answer:
    """The head's facts: the PD error at `offset` of the service log, which is `size` long."""
    return facts(
        log_errors=[
            {
                "file": SERVICE_LOG,
                "signature": "jaccl_protection_domain",
                "line": PD_LINE,
                "offset": offset,
            }
        ],
        log_sizes={SERVICE_LOG: size},
    )


def wrapper_failed(failed_starts: int, *backends: str) -> Answer:
    """The head's facts: the serve wrapper's record after `failed_starts` failed starts, the
    last one's failures on `backends` (JACCL's first)."""
    return facts(
        serve={
            "state": "failed",
            "backend": backends[0],
            "failed_starts": failed_starts,
            "failed_backends": list(backends),
            "failure": {
                "backend": backends[0],
                "host": "ai002",
                "reason": "rank failed",
                "line": PD_LINE,
            },
        }
    )


async def test_the_start_step_keeps_where_the_head_stood_before_the_start(tmp_path: Path) -> None:
    helpers = FakeHelpers(
        INVENTORY,
        {
            ("ai001", "service"): Answer(
                {**DEFAULTS["service"], "log_sizes": {SERVICE_LOG: 1000}, "failed_starts": 4}
            )
        },
    )
    run_context = context(Health(), tmp_path, helpers)
    assert (await StartService(model=model()).run(run_context)).outcome is StepOutcome.OK
    assert run_context.start_marks == BEFORE_START


async def test_a_start_script_that_wrote_a_jaccl_error_after_its_start_fails_verify_at_once(
    tmp_path: Path,
) -> None:
    """A plain JACCL script fails the same way on every restart: no wait for start_timeout."""
    inventory = script_inventory()
    helpers = FakeHelpers(inventory, {("ai001", "facts"): pd_error_at(1200)})
    health = Health()  # down, every time
    result = await Verify(model=model(inventory), within=600, poll_interval=0.01).run(
        context(health, tmp_path, helpers, inventory=inventory, start_marks=BEFORE_START)
    )
    assert result.outcome is StepOutcome.FAILED and health.calls == 1
    assert f"on ai001: {PD_LINE}" in result.detail and "start_timeout (600s)" in result.detail


async def test_a_wrapper_start_that_failed_on_jaccl_alone_fails_verify_at_once(
    tmp_path: Path,
) -> None:
    """JACCL pinned and failing: the ring pin that follows is what helps."""
    helpers = FakeHelpers(INVENTORY, {("ai001", "facts"): wrapper_failed(5, "jaccl")})
    health = Health()
    result = await Verify(model=model(), within=600, poll_interval=0.01).run(
        context(health, tmp_path, helpers, start_marks=BEFORE_START)
    )
    assert result.outcome is StepOutcome.FAILED and health.calls == 1
    assert f"failed on JACCL alone, on ai002: {PD_LINE}; ring was not tried" in result.detail


@pytest.mark.parametrize(
    ("service", "answer"),
    [
        ("script", pd_error_at(400)),  # the error is older than the start: it may still come up
        ("wrapper", pd_error_at(1200)),  # a wrapper is judged by its record, not the log
        ("wrapper", wrapper_failed(4, "jaccl")),  # no failed start since ours
        ("wrapper", wrapper_failed(5, "jaccl", "ring")),  # it tried ring too: a pin changes nothing
    ],
    ids=["script-old-error", "wrapper-log-line", "wrapper-no-new-failure", "wrapper-tried-ring"],
)
async def test_verify_waits_out_the_start_timeout_when_waiting_may_still_help(
    service: str,
    answer: Answer,
    tmp_path: Path,
) -> None:
    inventory = script_inventory() if service == "script" else INVENTORY
    helpers = FakeHelpers(inventory, {("ai001", "facts"): answer})
    health = Health()
    result = await Verify(model=model(inventory), within=0.05, poll_interval=0.01).run(
        context(health, tmp_path, helpers, inventory=inventory, start_marks=BEFORE_START)
    )
    assert result.outcome is StepOutcome.FAILED and health.calls > 1
    assert result.detail == "down"


async def test_without_a_start_of_this_run_verify_only_probes(tmp_path: Path) -> None:
    helpers = FakeHelpers(INVENTORY, {("ai001", "facts"): wrapper_failed(5, "jaccl")})
    result = await Verify(model=model(), within=0.03, poll_interval=0.01).run(
        context(Health(), tmp_path, helpers)
    )
    assert result.detail == "down" and helpers.of("facts") == []
