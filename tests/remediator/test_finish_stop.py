"""At start-up the remediator finishes the work of a run that stopped a service and never
started it again (it died between the two): it sweeps every node first, and starts the
service even when what only a reboot ends survives the sweep (named, with the node to
reboot: a survivor never keeps the service stopped), and journals why. A stop by anyone
else, or on a model whose circuit is open, is journaled and left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlx_medic.remediator.config import FLAG_FOUND_BY, ConfigSource
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, owner_tag
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.playbooks import FINISH_STOP, FinishStopPlaybook
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import (
    MODEL,
    OTHER,
    Health,
    dead_pid,
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

STOPPED = {
    **DEFAULTS["service"],
    "stopped_by": {"run": "remediator run 1", "at": 1.0, "reason": f"{MODEL} is down"},
}
RUNNING = {**DEFAULTS["service"], "stopped_by": None}


def engine_with(
    tmp_path: Path,
    engines: list[Engine],
    answers: dict[tuple[str, str], Any],
    crashed: tuple[str, ...] = (MODEL,),
    up: bool = True,
    config_source: ConfigSource | None = None,
    pid: int | None = None,
) -> tuple[Engine, FakeHelpers]:
    """An engine whose journal holds a run of each `crashed` model left in flight by a
    process of replica-a that died (`pid`; run 1 for the first), its helpers answering
    `answers`."""
    inventory = make_inventory(start_timeout="1s")
    config = make_config(tmp_path)
    journal = Journal(config.journal)
    for model in crashed:
        run_id = journal.create_run(
            model=model,
            playbook="recover",
            trigger_kind="alert",
            owner=owner_tag("replica-a", pid or dead_pid()),
            now=1.0,
        )
        journal.start_run(run_id, 2.0)
    engine = make_engine(
        config,
        inventory,
        transport=LocalTransport(),
        journal=journal,
        playbooks={FINISH_STOP: FinishStopPlaybook()},
        health=Health(
            verdicts=[HealthVerdict.up("answered")] if up else [HealthVerdict.down("refused")]
        ),
        config_source=config_source,
    )
    engines.append(engine)
    helpers = FakeHelpers(inventory, {("ai005", "service"): Answer(RUNNING), **answers})
    engine.helpers = helpers
    return engine, helpers


def calls(helpers: FakeHelpers) -> list[str]:
    return [
        f"{helper} {args[1]}" if helper == "service" else helper
        for _, helper, args in helpers.calls
        if (helper, args[-1:]) != ("service", ("status",))
    ]


async def test_a_service_a_dead_run_left_stopped_is_swept_for_then_started(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(tmp_path, engines, {("ai001", "service"): Answer(STOPPED)})
    await engine.start()
    await engine.wait_idle()
    run, crashed = engine.journal.list_runs()
    assert crashed.outcome == "interrupted"
    assert (run.playbook, run.trigger, run.outcome) == (FINISH_STOP, "start-up", "succeeded")
    assert [s.name for s in run.steps] == ["sweep", "clean-tmp", "start-service", "verify"]
    assert calls(helpers) == [*["sweep"] * 4, *["clean"] * 4, "service start", "facts"]
    (event,) = engine.journal.list_events(kind="service_left_stopped")
    assert event.detail == (
        f"com.example.{MODEL} on ai001 was left stopped by remediator run 1 ({MODEL} is down);"
        f" run {run.id} sweeps every node, then starts it"
    )


async def test_unkillable_survivors_never_keep_the_service_stopped(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(
        tmp_path,
        engines,
        {("ai001", "service"): Answer(STOPPED), ("ai004", "sweep"): swept(stuck(8))},
    )
    await engine.start()
    await engine.wait_idle()
    run, _crashed = engine.journal.list_runs()
    assert run.outcome == "succeeded"
    assert [(s.name, s.outcome) for s in run.steps] == [
        ("sweep", "ok"),
        ("clean-tmp", "ok"),
        ("start-service", "ok"),
        ("verify", "ok"),
    ]
    assert "service start" in calls(helpers)
    assert run.detail == (
        f"{MODEL} verified healthy; survivors left: ai004: pid 8 (rank, state uninterruptible,"
        " holding 1 protection domain(s) on rdma_en2) survives SIGKILL: python -m"
        " mlx_lm.server. reboot ai004 to free 1 protection domain(s) (models placed there:"
        f" {MODEL}, {OTHER})"
    )
    (event,) = engine.journal.list_events(kind="unkillable")
    assert event.detail.startswith(
        "1 process(es) on ai004 survive SIGKILL (pids 8); reboot"
        " ai004 to free 1 protection domain(s)"
    )
    assert engine.journal.list_events(kind="escalation") == []


async def test_a_survivor_holding_the_port_gets_a_start_then_an_escalation_to_reboot_it(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(
        tmp_path,
        engines,
        {
            ("ai001", "service"): Answer(STOPPED),
            ("ai001", "sweep"): swept(stuck(8, holds_port=True)),
        },
        up=False,
    )
    await engine.start()
    await engine.wait_idle()
    run, _crashed = engine.journal.list_runs()
    assert run.outcome == "escalated"
    assert [(s.name, s.outcome) for s in run.steps][-3:] == [
        ("start-service", "ok"),
        ("verify", "failed"),
        ("escalate", "ok"),
    ]
    assert "service start" in calls(helpers)  # never left stopped by a survivor
    assert run.next_action is not None and run.next_action.startswith(
        f"reboot ai001 to free 1 protection domain(s) (models placed there: {MODEL}): a"
        f" process there that survives SIGKILL holds {MODEL}'s port"
    )
    assert "survivors left: ai001: pid 8 (rank, state uninterruptible" in run.detail


async def test_a_stop_naming_this_replica_and_its_dead_run_is_finished(
    tmp_path: Path, engines: list[Engine]
) -> None:
    dead = dead_pid()
    ours = {"run": f"remediator run 1 (pid {dead} on replica-a)", "at": 1.0, "reason": "down"}
    answers = {("ai001", "service"): Answer({**STOPPED, "stopped_by": ours})}
    engine, helpers = engine_with(tmp_path, engines, answers, pid=dead)
    await engine.start()
    await engine.wait_idle()
    run, _crashed = engine.journal.list_runs()
    assert (run.playbook, run.outcome) == (FINISH_STOP, "succeeded")
    assert "service start" in calls(helpers)


async def test_a_stop_by_another_replicas_run_of_the_same_number_is_not_ours(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """Each replica's journal numbers its runs from 1: the record's pid and host tell."""
    theirs = {"run": "remediator run 1 (pid 4242 on replica-b)", "at": 1.0, "reason": "down"}
    answers = {("ai001", "service"): Answer({**STOPPED, "stopped_by": theirs})}
    engine, helpers = engine_with(tmp_path, engines, answers)
    await engine.start()
    await engine.wait_idle()
    assert len(engine.journal.list_runs()) == 1 and calls(helpers) == []  # the crashed one
    (event,) = engine.journal.list_events(kind="service_left_stopped")
    assert "left stopped by remediator run 1 (pid 4242 on replica-b) (down)" in event.detail
    assert "which was interrupted: left stopped for a person to start" in event.detail


async def test_a_stop_by_a_person_or_on_an_open_circuit_is_left_alone(
    tmp_path: Path, engines: list[Engine]
) -> None:
    by_person = {**STOPPED, "stopped_by": {"run": "root at a terminal", "reason": "upgrade"}}
    by_run_2 = {**STOPPED, "stopped_by": {"run": "remediator run 2", "reason": "down"}}
    engine, helpers = engine_with(
        tmp_path,
        engines,
        {("ai001", "service"): Answer(by_person), ("ai005", "service"): Answer(by_run_2)},
        crashed=(MODEL, OTHER),
        config_source=ConfigSource(Path("/srv/medic/remediator.yml"), FLAG_FOUND_BY),
    )
    engine.journal.open_circuit(
        OTHER, reason="unrecoverable", next_action="reboot", by_whom="test", now=1.0
    )
    await engine.start()
    await engine.wait_idle()
    assert len(engine.journal.list_runs()) == 2 and calls(helpers) == []  # the crashed ones
    details = sorted(e.detail for e in engine.journal.list_events(kind="service_left_stopped"))
    assert "; not by remediator run 1 (pid " in details[0]
    assert " on replica-a), which was interrupted: left stopped for a" in details[0]
    assert "the model's circuit is open: left stopped" in details[1]
    for model, detail in zip((MODEL, OTHER), details, strict=True):  # typed as printed
        assert detail.endswith(
            f" (`mlx-medic remediate {model} --config.file /srv/medic/remediator.yml` sweeps first)"
        )


async def test_a_head_that_cannot_be_asked_at_start_up_is_journaled_and_counted(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, _ = engine_with(
        tmp_path, engines, {("ai001", "service"): unreachable("ai001", "service")}
    )
    await engine.start()
    await engine.wait_idle()
    assert len(engine.journal.list_runs()) == 1  # the crashed one: nothing new
    (event,) = engine.journal.list_events(kind="service_check_failed")
    assert "ai001" in event.detail
    assert engine.m_unreachable.labels(model=MODEL, node="ai001")._value.get() == 1
