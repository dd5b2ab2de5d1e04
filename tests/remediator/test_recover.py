"""`recover` run by the engine, its node helpers answering from a script: every step acts
through a helper and is journaled with its targets and each node's answer; the lock is let
go before the start; a JACCL failure after the start pins ring; what the sweep cannot end
(uninterruptible: only a reboot ends it) is named with the node to reboot and the service
is started anyway, while a survivor the sweep could have ended and an unreachable node
escalate with nothing started."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import RunView
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.state.model_lock_file import LockInfo
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import (
    MODEL,
    Health,
    alert,
    let_go_once_the_run_waits,
    make_config,
    make_engine,
    make_inventory,
)
from tests.remediator.fake_helpers import (
    DEFAULTS,
    Answer,
    FakeHelpers,
    stuck,
    swept,
    unreachable,
)

NODES = ["ai001", "ai002", "ai003", "ai004"]
JACCL_LINE = "[jaccl] Couldn't allocate protection domain"
DOWN, UP = HealthVerdict.down("connection refused"), HealthVerdict.up("completed a request")


def inventory() -> Inventory:
    return make_inventory(backoff=0, start_timeout="1s")  # one probe per verify


def engine_with(
    tmp_path: Path,
    engines: list[Engine],
    health: Health,
    answers: dict[tuple[str, str], Any] | None = None,
    on_call: Callable[[str, str, tuple[str, ...]], None] | None = None,
) -> tuple[Engine, FakeHelpers]:
    """An engine running `recover`, its helpers answering from `answers`."""
    inv = inventory()
    config = make_config(tmp_path, lock_wait="5s")
    engine = make_engine(config, inv, transport=LocalTransport(), health=health)
    engines.append(engine)
    helpers = FakeHelpers(inv, answers, on_call=on_call)
    engine.helpers = helpers
    return engine, helpers


async def recover(
    tmp_path: Path,
    engines: list[Engine],
    health: Health,
    answers: dict[tuple[str, str], Any] | None = None,
) -> tuple[Engine, FakeHelpers, RunView]:
    held_at_start: list[bool] = []
    held_at_stop: list[bool] = []

    def on_call(node: str, helper: str, args: tuple[str, ...]) -> None:
        lock = engine.inventory.state_dir / "locks" / f"{MODEL}.lock"
        if helper == "service" and args[1] in ("start", "restart"):
            held_at_start.append(lock.exists())
        if helper == "service" and args[1] == "stop":
            held_at_stop.append(lock.exists())

    engine, helpers = engine_with(tmp_path, engines, health, answers, on_call)
    await engine.submit(alert("r1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert all(held_at_stop), "the model lock was not held while the service was stopped"
    assert not any(held_at_start), "the model lock was still held when the service started"
    return engine, helpers, run


def steps(run: RunView) -> list[tuple[str, str]]:
    return [(s.name, s.outcome) for s in run.steps]


async def test_recover_acts_through_the_helpers_in_order_and_journals_every_answer(
    tmp_path: Path, engines: list[Engine]
) -> None:
    _, helpers, run = await recover(tmp_path, engines, Health(verdicts=[DOWN, UP]))
    assert run.outcome == "succeeded"
    assert steps(run) == [
        ("preflight", "ok"),
        ("stop-service", "ok"),
        ("sweep", "ok"),
        ("clean-tmp", "ok"),
        ("start-service", "ok"),
        ("verify", "ok"),
    ]
    order = [(helper, args[1] if helper == "service" else "") for _, helper, args in helpers.calls]
    assert order == [
        *[("facts", "")] * 4,
        ("service", "stop"),
        *[("sweep", "")] * 4,
        *[("clean", "")] * 4,
        ("service", "start"),
        ("facts", ""),
    ]
    sweep = run.steps[2]
    assert sweep.targets == [f"{MODEL} on {n}" for n in NODES]
    assert all(f'"node": "{n}"' in sweep.output for n in NODES)
    # the head's record names the run and its replica (this process, on replica-a)
    by = f"remediator run {run.id} (pid {os.getpid()} on replica-a)"
    assert helpers.of("service")[0][1][2:4] == ("--by", by)


async def test_the_preflight_facts_are_asked_while_the_run_rechecks_and_takes_the_lock(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """One round trip less before the start: the facts are only read, so they are asked
    beside the re-check, and the preflight uses that answer instead of asking again."""
    health = Health(verdicts=[DOWN, UP])
    health.gate = asyncio.Event()
    engine, helpers = engine_with(tmp_path, engines, health)
    await engine.submit(alert("r1"))
    for _ in range(50):
        if len(helpers.of("facts")) == len(NODES):
            break
        await asyncio.sleep(0.01)
    assert sorted(node for node, _ in helpers.of("facts")) == NODES  # the re-check still waits
    assert health.calls == 1 and not helpers.of("service")
    health.gate.set()
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded"
    before_stop = [h for _, h, _ in helpers.calls[: helpers.calls.index(helpers.calls[4])]]
    assert before_stop == ["facts"] * 4 and helpers.calls[4][1] == "service"
    assert run.steps[0].name == "preflight" and "64.0 GiB free" in run.steps[0].detail


async def test_a_run_whose_recheck_finds_the_model_up_has_only_read_the_facts(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(tmp_path, engines, Health(verdicts=[UP]))
    await engine.submit(alert("r1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "skipped" and run.steps == []
    assert {helper for _, helper, _ in helpers.calls} <= {"facts"}


async def test_a_run_of_a_model_paused_before_it_started_asks_nothing_of_the_nodes(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """Paused: a person works on it. Not even the read-only facts are asked."""
    engine, helpers = engine_with(tmp_path, engines, Health(verdicts=[DOWN]))
    await engine.submit(alert("r1"))  # queued: its task has not run yet
    engine.journal.set_pause(MODEL, reason="hands off", by_whom="me", now=1.0)
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert (run.outcome, run.detail) == ("skipped", "pause set before the run started")
    assert helpers.calls == []


async def test_after_waiting_for_the_lock_the_preflight_asks_the_facts_again(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """An answer from before the wait may be old: the holder (a serve wrapper starting)
    may have changed the nodes meanwhile."""
    then, now = (
        Answer({**DEFAULTS["facts"], "memory": {"available_bytes": g * 2**30}}) for g in (1, 2)
    )
    health = Health(verdicts=[DOWN, DOWN, UP])
    engine, helpers = engine_with(tmp_path, engines, health, {("ai001", "facts"): [then, now]})
    lock = engine.inventory.state_dir / "locks" / f"{MODEL}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = LockInfo(None, 1, None, "wrapper-host", time.time(), "serve", "7", time.time() + 60, "t")
    lock.write_text(held.to_json())
    letting_go = let_go_once_the_run_waits(engine, lock)
    await engine.submit(alert("r1"))
    await engine.wait_idle()
    await letting_go
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded"
    assert [node for node, _ in helpers.of("facts")][:8] == [*NODES, *NODES]
    assert run.steps[0].detail.startswith("ai001: memory 2.0 GiB free")


@pytest.mark.parametrize(
    ("state", "verified"), [("serving", "jaccl"), ("starting", "jaccl"), ("stopped", None)]
)
async def test_a_verified_start_records_the_backend_a_live_wrapper_on_the_head_serves(
    state: str, verified: str | None, tmp_path: Path, engines: list[Engine]
) -> None:
    record = Answer(
        {**DEFAULTS["facts"], "serve": {"state": state, "backend": "jaccl", "failure": None}}
    )
    engine, _, run = await recover(
        tmp_path, engines, Health(verdicts=[DOWN, UP]), {("ai001", "facts"): record}
    )
    on = f" on {verified}" if verified else ""
    assert (run.outcome, run.detail) == ("succeeded", f"{MODEL} verified healthy{on}")
    gauge = engine.m_last_verified_backend
    assert gauge.labels(model=MODEL, backend="jaccl")._value.get() == (verified == "jaccl")
    assert gauge.labels(model=MODEL, backend="ring")._value.get() == 0


async def test_a_jaccl_failure_after_the_start_pins_ring_restarts_and_verifies_ring(
    tmp_path: Path, engines: list[Engine]
) -> None:
    facts = Answer(
        {
            **DEFAULTS["facts"],
            "log_errors": [{"signature": "jaccl_protection_domain", "line": JACCL_LINE}],
        }
    )
    engine, helpers, run = await recover(
        tmp_path, engines, Health(verdicts=[DOWN, DOWN, UP]), {("ai001", "facts"): facts}
    )
    assert run.outcome == "succeeded" and run.detail == f"{MODEL} verified healthy on ring"
    assert steps(run)[-4:] == [
        ("verify", "failed"),
        ("pin-ring", "ok"),
        ("restart-service", "ok"),
        ("verify-ring", "ok"),
    ]
    assert JACCL_LINE in run.steps[-3].detail
    assert helpers.of("backend") == [
        (
            "ai001",
            (
                MODEL,
                "set",
                "ring",
                "--by",
                f"remediator run {run.id} (pid {os.getpid()} on replica-a)",
                "--reason",
                f"JACCL failed on ai001: {JACCL_LINE}",
            ),
        )
    ]
    assert engine.m_last_verified_backend.labels(model=MODEL, backend="ring")._value.get() == 1


ADVICE_AI002 = f"reboot ai002 to free 1 protection domain(s) (models placed there: {MODEL})"
SURVIVOR_AI002 = (
    "ai002: pid 77 (rank, state uninterruptible, holding 1 protection domain(s)"
    " on rdma_en2) survives SIGKILL: python -m mlx_lm.server"
)


async def test_a_survivor_on_a_peer_is_named_the_service_started_and_the_run_succeeds(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The seed's fix: what only a reboot ends survives but stops accumulating; the model
    serves around it and on-call reads which node to reboot, with no escalation."""
    engine, helpers, run = await recover(
        tmp_path, engines, Health(verdicts=[DOWN, UP]), {("ai002", "sweep"): swept(stuck(77))}
    )
    assert run.outcome == "succeeded"
    assert steps(run) == [
        ("preflight", "ok"),
        ("stop-service", "ok"),
        ("sweep", "ok"),
        ("clean-tmp", "ok"),
        ("start-service", "ok"),
        ("verify", "ok"),
    ]
    assert [args[1] for _, args in helpers.of("service")] == ["stop", "start"]
    assert run.detail == (
        f"{MODEL} verified healthy; survivors left: {SURVIVOR_AI002}. {ADVICE_AI002}"
    )
    assert run.next_action is None
    assert f"{SURVIVOR_AI002}. {ADVICE_AI002}; the start goes on around them" in run.steps[2].detail
    (event,) = engine.journal.list_events(kind="unkillable")
    assert event.run_id == run.id
    assert event.detail.startswith(
        f"1 process(es) on ai002 survive SIGKILL (pids 77); {ADVICE_AI002}. processes: "
    )
    assert engine.m_unkillable.labels(model=MODEL, node="ai002")._value.get() == 1
    assert engine.m_unkillable.labels(model=MODEL, node="ai001")._value.get() == 0
    assert engine.journal.list_events(kind="escalation") == []
    assert engine.journal.blocking_control(MODEL) is None  # no circuit opened


async def test_a_survivor_holding_the_port_on_the_head_gets_a_start_then_its_reboot_as_next(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The service is started anyway (the serve wrapper keeps trying under KeepAlive and
    names the reboot itself); the verify fails, no ring pin is made (no backend can listen
    on a held port), and the escalation's next action is the head's reboot."""
    engine, helpers, run = await recover(
        tmp_path,
        engines,
        Health(verdicts=[DOWN, DOWN]),
        {("ai001", "sweep"): swept(stuck(77, holds_port=True))},
    )
    assert run.outcome == "escalated"
    assert steps(run) == [
        ("preflight", "ok"),
        ("stop-service", "ok"),
        ("sweep", "ok"),
        ("clean-tmp", "ok"),
        ("start-service", "ok"),
        ("verify", "failed"),
        ("pin-ring", "failed"),
    ]
    assert [args[1] for _, args in helpers.of("service")] == ["stop", "start"]
    assert helpers.of("backend") == []
    advice = f"reboot ai001 to free 1 protection domain(s) (models placed there: {MODEL})"
    assert f"next action: {advice}" in run.steps[2].detail
    assert run.next_action == (
        f"{advice}: a process there that survives SIGKILL holds {MODEL}'s port, so no start"
        f" can listen on it until then; com.example.{MODEL} is left started and serves once"
        f" the port is free; then `mlx-medic resume {MODEL}`"
    )
    assert "recover" not in run.next_action
    assert "survivors left: ai001: pid 77 (rank, state uninterruptible" in run.detail
    assert engine.m_escalations.labels(model=MODEL, reason="unrecoverable")._value.get() == 1


async def test_a_failed_start_beside_a_peer_survivor_escalates_with_its_reboot_first(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """A survivor holds protection domains a JACCL start needs: an escalation after a
    failed verify puts its node's reboot first."""
    _, helpers, run = await recover(
        tmp_path, engines, Health(verdicts=[DOWN, DOWN]), {("ai002", "sweep"): swept(stuck(77))}
    )
    assert run.outcome == "escalated"
    assert steps(run)[-2:] == [("verify", "failed"), ("pin-ring", "failed")]
    assert [args[1] for _, args in helpers.of("service")] == ["stop", "start"]
    assert run.next_action is not None
    assert run.next_action.startswith(f"{ADVICE_AI002}, then read {MODEL}'s service log on ai001")
    assert f"survivors left: {SURVIVOR_AI002}. {ADVICE_AI002}" in run.detail


async def test_a_survivor_the_sweep_could_have_ended_escalates_and_nothing_is_started(
    tmp_path: Path, engines: list[Engine]
) -> None:
    sleeping = {
        "pid": 78,
        "start_time": 1.0,
        "cmdline": ["python"],
        "role": "rank",
        "state": "sleeping",
    }
    engine, helpers, run = await recover(
        tmp_path,
        engines,
        Health(verdicts=[DOWN]),
        {("ai002", "sweep"): swept(stuck(77), killable=(sleeping,))},
    )
    assert run.outcome == "escalated" and steps(run)[-1] == ("sweep", "failed")
    assert [args[1] for _, args in helpers.of("service")] == ["stop"]  # never started
    assert "ai002: pid 78 (rank, state sleeping) survived the sweep" in run.detail
    assert run.next_action is not None and run.next_action.startswith("read the step's output")
    assert f"; also {ADVICE_AI002}; then `mlx-medic resume {MODEL}`" in run.next_action
    assert engine.m_unkillable.labels(model=MODEL, node="ai002")._value.get() == 1
    assert engine.m_escalations.labels(model=MODEL, reason="step_failed")._value.get() == 1


async def test_a_node_unreachable_at_preflight_escalates_before_the_service_is_touched(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers, run = await recover(
        tmp_path,
        engines,
        Health(verdicts=[DOWN]),
        {("ai003", "facts"): unreachable("ai003", "facts")},
    )
    assert run.outcome == "escalated" and steps(run) == [("preflight", "unreachable")]
    assert helpers.of("service") == [] and helpers.of("sweep") == []
    assert engine.m_unreachable.labels(model=MODEL, node="ai003")._value.get() == 1
    assert run.next_action is not None and "ai003" in run.next_action


async def test_a_start_that_never_answers_without_a_jaccl_failure_escalates_with_facts(
    tmp_path: Path, engines: list[Engine]
) -> None:
    _, helpers, run = await recover(tmp_path, engines, Health(verdicts=[DOWN, DOWN]))
    assert run.outcome == "escalated"
    assert steps(run)[-2:] == [("verify", "failed"), ("pin-ring", "failed")]
    assert "a ring pin would not help" in run.detail
    assert helpers.of("backend") == []
    assert [args[1] for _, args in helpers.of("service")] == ["stop", "start"]
