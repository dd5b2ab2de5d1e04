"""The engine's decisions and runs: single flight, dedupe, staleness, pause,
budget and circuit, crash recovery, dry run, and the lock across replicas."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition
from mlx_medic.remediator.config import (
    DEFAULT_CONFIG_FILE,
    DEFAULT_PATH_FOUND_BY,
    FLAG_FOUND_BY,
    ConfigError,
    ConfigSource,
)
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, RunView, owner_tag
from mlx_medic.remediator.model_health import HealthVerdict, probe_model_health
from mlx_medic.transport import LocalTransport, SshTransport, TransportError
from mlx_medic.transport.interface import CommandResult
from tests.node.inventories import helper_inventory
from tests.remediator.engine_fakes import (
    MODEL,
    OTHER,
    GatedPlaybook,
    Health,
    alert,
    dead_pid,
    make_config,
    make_engine,
    make_inventory,
)
from tests.transport_fakes import RecordingTransport


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory(restart_budget=3, backoff=0)


@pytest.fixture
def gate() -> GatedPlaybook:
    """A run of the "gated" playbook holds the model until the test releases it."""
    return GatedPlaybook()


async def only_run(engine: Engine, event: AlertEvent) -> RunView:
    """Submit an alert that starts a run, wait for it to end; the journal's only run."""
    assert await engine.submit(event) == Disposition.STARTED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    return run


def outcome_of(engine: Engine, run_id: int | None = None) -> str:
    runs = engine.journal.list_runs()
    run = runs[0] if run_id is None else engine.journal.get_run(run_id)
    assert run is not None
    return run.outcome


async def test_a_hundred_concurrent_deliveries_of_one_alert_start_exactly_one_run(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(make_config(tmp_path, "succeeding"), inventory, tmp_path=tmp_path)
    engines.append(engine)
    same = alert("a1")
    results = await asyncio.gather(*(engine.submit(same) for _ in range(100)))
    assert results.count(Disposition.STARTED) == 1
    assert results.count(Disposition.DUPLICATE) == 99
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded" and run.fingerprint == "a1"


async def test_a_hundred_different_alerts_for_a_model_in_progress_give_one_run(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], gate: GatedPlaybook
) -> None:
    engine = make_engine(
        make_config(tmp_path, "gated"), inventory, playbooks={"gated": gate}, tmp_path=tmp_path
    )
    engines.append(engine)
    assert await engine.submit(alert("first")) == Disposition.STARTED
    await asyncio.wait_for(gate.entered.wait(), 5)
    results = await asyncio.gather(*(engine.submit(alert(f"fp{i}")) for i in range(100)))
    assert results == [Disposition.ABSORBED] * 100
    assert engine.m_in_progress.labels(model=MODEL)._value.get() == 1
    gate.release.set()
    await engine.wait_idle()
    assert [r.outcome for r in engine.journal.list_runs()] == ["succeeded"]
    absorbed = engine.journal.list_events(kind="absorbed", limit=1000)
    assert len(absorbed) == 100 and {e.run_id for e in absorbed} == {1}


async def test_a_redelivery_after_a_restart_is_still_a_duplicate(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    config = make_config(tmp_path, "succeeding")
    first = make_engine(config, inventory, tmp_path=tmp_path)
    engines.append(first)
    same = alert("again")
    assert await first.submit(same) == Disposition.STARTED
    await first.wait_idle()
    await first.close()
    second = make_engine(config, inventory, tmp_path=tmp_path)
    engines.append(second)
    await second.start()
    assert await second.submit(same) == Disposition.DUPLICATE
    assert len(second.journal.list_runs()) == 1


async def test_a_resolved_alert_cancels_its_run_while_still_queued(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(up=False)
    health.gate = asyncio.Event()  # the re-check waits: the run stays queued
    engine = make_engine(
        make_config(tmp_path, "succeeding"), inventory, health=health, tmp_path=tmp_path
    )
    engines.append(engine)
    assert await engine.submit(alert("q1")) == Disposition.STARTED
    await asyncio.sleep(0)
    resolved = alert("q1", status=AlertStatus.RESOLVED)
    assert await engine.submit(resolved) == Disposition.RESOLVED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "cancelled" and "resolved before the run started" in run.detail
    assert run.steps == []
    (event,) = engine.journal.list_events(kind="resolved")
    assert "cancelled queued run" in event.detail


async def test_a_resolved_alert_does_not_stop_a_run_already_executing(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], gate: GatedPlaybook
) -> None:
    engine = make_engine(
        make_config(tmp_path, "gated"), inventory, playbooks={"gated": gate}, tmp_path=tmp_path
    )
    engines.append(engine)
    await engine.submit(alert("x1"))
    await asyncio.wait_for(gate.entered.wait(), 5)
    assert await engine.submit(alert("x1", status=AlertStatus.RESOLVED)) == Disposition.RESOLVED
    gate.release.set()
    await engine.wait_idle()
    assert outcome_of(engine) == "succeeded"


async def test_an_alert_older_than_max_alert_age_is_skipped_with_the_reason(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding", max_alert_age="1h"), inventory, tmp_path=tmp_path
    )
    engines.append(engine)
    old = alert("old", starts_at=datetime.now(UTC) - timedelta(days=3))
    assert await engine.submit(old) == Disposition.STALE
    (event,) = engine.journal.list_events(kind="stale")
    assert "72.0h old" in event.detail and event.model == MODEL
    assert engine.journal.list_runs() == []


async def test_a_model_that_is_up_again_when_the_run_is_due_is_left_alone(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding"), inventory, health=Health(up=True), tmp_path=tmp_path
    )
    engines.append(engine)
    assert await engine.submit(alert("up")) == Disposition.STARTED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "skipped" and "up again" in run.detail and run.steps == []
    assert not run.counted


async def test_an_unknown_model_or_unrouted_alert_is_journaled_and_ignored(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(make_config(tmp_path, "succeeding"), inventory, tmp_path=tmp_path)
    engines.append(engine)
    canary = tmp_path / "CANARY"
    hostile = [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        "../../etc/passwd",
        "a\nb",
        "nul\x00byte",
    ]
    for i, value in enumerate(hostile):
        assert await engine.submit(alert(f"h{i}", value)) == Disposition.UNKNOWN_MODEL
    assert await engine.submit(alert("nolabel", None)) == Disposition.UNKNOWN_MODEL
    assert await engine.submit(alert("other", alertname="DiskFull")) == Disposition.UNROUTED
    await engine.wait_idle()
    assert engine.journal.list_runs() == [] and not canary.exists()
    events = engine.journal.list_events(kind="unknown_model", limit=20)
    assert len(events) == len(hostile) + 1 and all(e.model is None for e in events)
    assert "label model=missing" in events[0].detail
    (unrouted,) = engine.journal.list_events(kind="unrouted")
    assert "no playbook for alert 'DiskFull'" in unrouted.detail
    assert not list(inventory.state_dir.rglob("*"))  # nothing created on any node


async def test_pause_stops_new_runs_until_resume_and_reaches_a_running_engine(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    config = make_config(tmp_path, "succeeding")
    engine = make_engine(config, inventory, tmp_path=tmp_path)
    engines.append(engine)
    cli = Journal(config.journal)  # what `mlx-medic pause` opens
    cli.set_pause(None, reason="maintenance", by_whom="me@here", now=1.0)
    assert await engine.submit(alert("p1")) == Disposition.PAUSED
    cli.clear_pause(None)
    cli.set_pause(MODEL, reason="just this one", by_whom="me@here", now=2.0)
    assert await engine.submit(alert("p2")) == Disposition.PAUSED
    assert await engine.submit(alert("o1", OTHER)) == Disposition.STARTED
    cli.clear_pause(MODEL)
    # the same firing, delivered again after resume, now acts
    assert await engine.submit(alert("p2")) == Disposition.STARTED
    await engine.wait_idle()
    assert "pause on all models" in engine.journal.list_events(kind="paused")[-1].detail


async def _notify_server(port: int, received: list[dict]) -> web.AppRunner:
    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response()

    app = web.Application()
    app.router.add_post("/escalations", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_a_spent_budget_escalates_once_then_nothing_acts_until_resume(
    tmp_path: Path, engines: list[Engine], unused_tcp_port: int
) -> None:
    received: list[dict] = []
    runner = await _notify_server(unused_tcp_port, received)
    try:
        inventory = make_inventory(restart_budget=2, backoff=0)
        config = make_config(
            tmp_path, "succeeding", notify_url=f"http://127.0.0.1:{unused_tcp_port}/escalations"
        )
        engine = make_engine(config, inventory, tmp_path=tmp_path)
        engines.append(engine)
        for fp in ("b1", "b2"):
            assert await engine.submit(alert(fp)) == Disposition.STARTED
            await engine.wait_idle()
        assert await engine.submit(alert("b3")) == Disposition.CIRCUIT_OPEN
        assert await engine.submit(alert("b4")) == Disposition.CIRCUIT_OPEN
        await engine.escalator.drain()
        await engine.wait_idle()
        assert len(engine.journal.list_runs()) == 2
        (escalation,) = engine.journal.list_events(kind="escalation")
        assert "restart budget spent" in escalation.detail
        assert f"mlx-medic resume {MODEL}" in escalation.detail
        assert engine.m_escalations.labels(model=MODEL, reason="budget_spent")._value.get() == 1
        assert len(received) == 1 and received[0]["reason"] == "budget_spent"

        Journal(config.journal).close_circuit(MODEL, now=engine.clock())  # `mlx-medic resume`
        assert await engine.submit(alert("b5")) == Disposition.STARTED
        await engine.wait_idle()
    finally:
        await runner.cleanup()


async def test_within_the_backoff_a_new_alert_is_journaled_and_not_started(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding"),
        make_inventory(restart_budget=3, backoff="10m"),
        tmp_path=tmp_path,
    )
    engines.append(engine)
    assert await engine.submit(alert("k1")) == Disposition.STARTED
    await engine.wait_idle()
    assert await engine.submit(alert("k2")) == Disposition.BACKOFF
    assert "backoff" in engine.journal.list_events(kind="backoff")[0].detail


async def test_a_state_a_restart_cannot_fix_escalates_with_the_next_action_in_words(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(make_config(tmp_path, "unrecoverable"), inventory, tmp_path=tmp_path)
    engines.append(engine)
    await engine.submit(alert("u1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "escalated"
    assert run.next_action == (
        "check that ai002 is up and answers SSH, reboot it if it hangs;"
        f" then `mlx-medic resume {MODEL}`"
    )
    assert await engine.submit(alert("u2")) == Disposition.CIRCUIT_OPEN
    assert engine.m_escalations.labels(model=MODEL, reason="unrecoverable")._value.get() == 1


@pytest.mark.parametrize(
    ("source", "resume"),
    [
        pytest.param(
            ConfigSource(Path("/srv/medic/remediator.yml"), FLAG_FOUND_BY),
            f"mlx-medic resume {MODEL} --config.file /srv/medic/remediator.yml",
            id="--config.file",
        ),
        pytest.param(
            ConfigSource(Path("/srv/medic/remediator.yml"), "$MLX_MEDIC_CONFIG"),
            f"mlx-medic resume {MODEL} --config.file /srv/medic/remediator.yml",
            id="from the environment",
        ),
        pytest.param(
            ConfigSource(DEFAULT_CONFIG_FILE, DEFAULT_PATH_FOUND_BY),
            f"mlx-medic resume {MODEL}",
            id="the default path",
        ),
    ],
)
async def test_an_escalations_resume_names_the_config_file_the_service_runs_with(
    tmp_path: Path,
    inventory: Inventory,
    engines: list[Engine],
    source: ConfigSource,
    resume: str,
) -> None:
    """Typed as printed, on the service's host, it reaches the journal the service writes."""
    config = make_config(tmp_path, "unrecoverable")
    engine = make_engine(config, inventory, tmp_path=tmp_path, config_source=source)
    engines.append(engine)
    await engine.submit(alert("u1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "escalated" and run.next_action is not None
    assert run.next_action.endswith(f"; then `{resume}`")
    (control,) = engine.journal.controls()
    assert control.next_action == run.next_action


async def test_a_verify_that_could_not_tell_ends_the_run_inconclusive_without_a_fallback(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(
        verdicts=[
            HealthVerdict.down("connection refused"),  # the re-check: act
            HealthVerdict.unknown("not probed: another probe ran longer than 11s"),  # the verify
        ]
    )
    engine = make_engine(
        make_config(tmp_path, "start-and-verify"), inventory, health=health, tmp_path=tmp_path
    )
    engines.append(engine)
    run = await only_run(engine, alert("v1"))
    assert run.outcome == "inconclusive" and run.counted
    assert "another probe ran longer than 11s" in run.detail
    assert [(s.name, s.outcome) for s in run.steps] == [
        ("start-jaccl", "ok"),
        ("verify-jaccl", "inconclusive"),
    ]  # no fallback to ring
    assert "another probe ran longer than 11s" in run.steps[1].detail
    assert run.next_action is not None and "by hand" in run.next_action
    assert engine.journal.blocking_control(MODEL) is None  # not a failed verify: no escalation
    value = engine.m_remediations.labels(model=MODEL, outcome="inconclusive")._value.get()
    assert value == 1


async def test_a_verify_that_finds_the_model_down_falls_back_to_the_next_backend(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(
        verdicts=[
            HealthVerdict.down("refused"),
            HealthVerdict.down("refused"),
            HealthVerdict.up("completed a 1-token request"),
        ]
    )
    engine = make_engine(
        make_config(tmp_path, "start-and-verify"), inventory, health=health, tmp_path=tmp_path
    )
    engines.append(engine)
    run = await only_run(engine, alert("v2"))
    assert run.outcome == "succeeded" and run.detail == f"{MODEL} verified healthy on ring"
    assert [(s.name, s.outcome) for s in run.steps] == [
        ("start-jaccl", "ok"),
        ("verify-jaccl", "failed"),
        ("start-ring", "ok"),
        ("verify-ring", "ok"),
    ]
    backend = engine.m_last_verified_backend
    assert backend.labels(model=MODEL, backend="ring")._value.get() == 1
    assert backend.labels(model=MODEL, backend="jaccl")._value.get() == 0


async def test_a_playbook_whose_recheck_acts_while_the_model_is_up_runs_its_steps(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "acts-while-up"), inventory, health=Health(up=True), tmp_path=tmp_path
    )
    engines.append(engine)
    run = await only_run(engine, alert("o1"))
    assert run.outcome == "succeeded" and run.counted
    assert [(s.name, s.outcome) for s in run.steps] == [
        ("remove-orphans", "ok"),
        ("verify-jaccl", "ok"),
    ]
    assert engine.journal.list_events(kind="stale") == []


async def test_the_same_playbook_skips_a_model_that_is_down_with_its_own_reason(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "acts-while-up"),
        inventory,
        health=Health(up=False),
        tmp_path=tmp_path,
    )
    engines.append(engine)
    run = await only_run(engine, alert("o2"))
    assert run.outcome == "skipped" and run.steps == [] and not run.counted
    assert run.detail == "not while the model is down: down"


async def test_recover_never_acts_on_a_model_it_could_not_confirm_down(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(verdicts=[HealthVerdict.unknown("could not probe on ai001: refused")])
    engine = make_engine(make_config(tmp_path), inventory, health=health, tmp_path=tmp_path)
    engines.append(engine)
    same = alert("u0")
    run = await only_run(engine, same)
    assert run.outcome == "skipped" and run.steps == []
    assert run.detail == f"could not confirm {MODEL} is down: could not probe on ai001: refused"
    assert await engine.submit(same) == Disposition.STARTED  # the redelivery may try again


def test_a_routed_playbook_the_engine_does_not_have_is_a_config_error_naming_it(
    tmp_path: Path, inventory: Inventory
) -> None:
    config = make_config(tmp_path, "tests.remediator.slow_playbook:SlowPlaybook")
    with pytest.raises(ConfigError) as caught:
        make_engine(config, inventory, tmp_path=tmp_path)
    message = str(caught.value)
    assert "routing.playbooks" in message and "LLMModelDown" in message
    assert "unknown playbook 'tests.remediator.slow_playbook:SlowPlaybook'" in message
    assert "recover" in message  # the names it could have used
    with pytest.raises(ConfigError, match="unknown playbook 'succeeding'"):
        Engine(
            make_config(tmp_path, "succeeding"),
            inventory,
            Journal(config.journal),
            LocalTransport(),
            registry=CollectorRegistry(),
        )


async def test_a_dry_run_journals_every_planned_step_and_executes_nothing(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    transport = RecordingTransport()
    engine = make_engine(make_config(tmp_path, dry_run=True), inventory, transport=transport)
    engines.append(engine)
    assert await engine.submit(alert("d1")) == Disposition.STARTED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "planned" and run.dry_run and not run.counted
    assert {s.outcome for s in run.steps} == {"planned"}
    every = "ai001, ai002, ai003, ai004"
    assert [(s.name, s.node) for s in run.steps] == [
        ("preflight", every),
        ("stop-service", "ai001"),
        ("sweep", every),
        ("clean-tmp", every),
        ("start-service", "ai001"),
        ("verify", "ai001"),
        ("pin-ring", "ai001"),
        ("restart-service", "ai001"),
        ("verify-ring", "ai001"),
        ("escalate", "ai001"),
    ]
    assert run.steps[1].command == [
        "sudo",
        "-n",
        "/bin/launchctl",
        "bootout",
        f"system/com.example.{MODEL}",
    ]
    assert run.steps[3].targets == [f"/Users/ai/.cache/mlx-share/{MODEL}/tmp*"]
    assert "--pipeline" in run.steps[6].description
    assert [s.condition for s in run.steps[5:]] == [
        None,
        *["only if the start fails verification"] * 3,
        "only if the start on ring fails verification",
    ]
    # a step that did not run has no end and no duration, wherever it is read
    assert {(s.ended_at, s.duration) for s in run.steps} == {(None, None)}
    assert {s["duration_seconds"] for s in run.to_dict()["steps"]} == {None}
    assert transport.commands == []  # not even the lock: a dry run never takes it
    assert run.recheck == f"act: {MODEL} is still down: down"
    assert run.detail == (
        "dry run: 10 steps planned, nothing executed; lock: not taken (dry run);"
        " live mode would act now (0 of 3 runs used)"
    )
    assert engine.journal.blocking_control(MODEL) is None  # a dry run never escalates


class NoNodeAnswers(LocalTransport):
    """Every node is down: each command fails as SSH to a silent address does."""

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        raise TransportError(f"cannot reach {node.name} ({node.user}@{node.ssh}:22): timed out")


async def test_a_dry_run_against_a_cluster_that_does_not_answer_still_journals_its_plan(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    transport = NoNodeAnswers()

    async def probe_on_head(model: Model) -> HealthVerdict:
        return await probe_model_health(model, inventory, transport=transport, probe_from="head")

    config = make_config(tmp_path, dry_run=True)
    registry = CollectorRegistry()
    engine = make_engine(
        config, inventory, transport=transport, health=probe_on_head, registry=registry
    )
    engines.append(engine)
    run = await only_run(engine, alert("d1"))
    assert run.outcome == "planned" and not run.counted
    assert len(run.steps) == 10 and {s.outcome for s in run.steps} == {"planned"}
    assert run.recheck is not None
    assert run.recheck.startswith(
        f"not checked (a dry run plans anyway): could not confirm {MODEL} is down:"
        " could not probe on ai001: cannot reach ai001"
    )
    assert run.recheck.endswith(
        f"(probed `mlx-medic node probe {MODEL}` on the head ai001, over SSH)"
    )
    assert "lock: not taken (dry run)" in run.detail
    assert run.next_action is None
    unreachable = {"model": MODEL, "node": "ai001"}  # still counted: its alert tells on-call
    assert registry.get_sample_value("mlx_medic_node_unreachable_total", unreachable) == 1


async def test_every_run_journals_why_it_acted_or_not(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    up = Health(verdicts=[HealthVerdict.up("completed").probed_as("ai001:8080 from here")])
    engine = make_engine(
        make_config(tmp_path, "succeeding"), inventory, health=up, tmp_path=tmp_path
    )
    engines.append(engine)
    run = await only_run(engine, alert("r1"))
    assert (run.outcome, run.recheck) == (
        "skipped",
        "skip: model is up again: completed (probed ai001:8080 from here)",
    )
    assert run.to_dict()["recheck"] == run.recheck
    by_hand = await engine.run_manual(MODEL, dry_run=True)
    manual = engine.journal.get_run(by_hand)
    assert manual is not None and manual.recheck == "no re-check: started by hand"
    assert manual.detail.endswith(
        "; live mode would act now if the model lock is free (started by hand)"
    )


async def test_a_dry_run_within_backoff_plans_and_says_live_mode_would_wait(
    tmp_path: Path, engines: list[Engine]
) -> None:
    inventory = make_inventory(restart_budget=3, backoff="10m")
    live = make_engine(make_config(tmp_path, "succeeding"), inventory, tmp_path=tmp_path)
    engines.append(live)
    assert outcome_of(live, (await only_run(live, alert("l1"))).id) == "succeeded"
    await live.close()
    dry = make_engine(
        make_config(tmp_path, "succeeding", dry_run=True), inventory, tmp_path=tmp_path
    )
    engines.append(dry)
    assert await dry.submit(alert("l2")) == Disposition.STARTED
    await dry.wait_idle()
    latest = dry.journal.list_runs()[0]
    assert latest.outcome == "planned"
    assert "; live mode would not act: backoff: 1 run(s) in the last" in latest.detail


async def test_start_up_marks_a_crashed_run_interrupted_and_releases_its_lock(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    config = make_config(tmp_path, "succeeding")
    journal = Journal(config.journal)
    crashed_pid = dead_pid()
    run_id = journal.create_run(
        model=MODEL,
        playbook="succeeding",
        trigger_kind="alert",
        owner=owner_tag("replica-a", crashed_pid),
        now=1.0,
    )
    journal.start_run(run_id, 2.0)
    journal.begin_step(
        run_id,
        seq=1,
        name="sweep",
        node="ai002",
        command=None,
        description="kill ranks",
        targets=[],
        now=3.0,
    )
    lock = inventory.state_dir / "locks" / f"{MODEL}.lock"  # where the head's helper keeps it
    lock.parent.mkdir(parents=True)
    lock.write_text(
        json.dumps(
            {
                "host": "replica-a",
                "pid": crashed_pid,
                "time": 2.0,
                "holder": "remediator",
                "run_id": str(run_id),
                "expires": 2e9,
            }
        )
    )
    engine = make_engine(config, inventory, journal=journal, tmp_path=tmp_path)
    engines.append(engine)
    await engine.start()
    run = journal.get_run(run_id)
    assert run is not None and run.outcome == "interrupted"
    assert [s.outcome for s in run.steps] == ["interrupted"]
    assert not lock.exists()
    assert journal.list_events(kind="lock_released")[0].model == MODEL
    assert await engine.submit(alert("after-crash")) == Disposition.STARTED
    await engine.wait_idle()
    assert outcome_of(engine) == "succeeded"


async def test_closing_the_engine_interrupts_a_run_and_releases_its_lock(
    tmp_path: Path, inventory: Inventory, gate: GatedPlaybook
) -> None:
    engine = make_engine(
        make_config(tmp_path, "gated"), inventory, playbooks={"gated": gate}, tmp_path=tmp_path
    )
    await engine.submit(alert("c1"))
    await asyncio.wait_for(gate.entered.wait(), 5)
    await engine.close()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "interrupted"
    assert [s.outcome for s in run.steps] == ["interrupted"]
    assert not list(inventory.state_dir.rglob("*.lock"))


async def test_a_manual_run_ignores_pause_but_not_the_lock(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], gate: GatedPlaybook
) -> None:
    config = make_config(tmp_path, "gated")
    engine = make_engine(config, inventory, playbooks={"gated": gate}, tmp_path=tmp_path)
    engines.append(engine)
    await engine.submit(alert("m1"))
    await asyncio.wait_for(gate.entered.wait(), 5)
    engine.journal.set_pause(None, reason="hands off", by_whom="me", now=1.0)
    by_hand = make_engine(
        config, inventory, playbooks={"gated": gate}, hostname="laptop", tmp_path=tmp_path
    )
    engines.append(by_hand)
    run_id = await by_hand.run_manual(MODEL, dry_run=False)
    run = by_hand.journal.get_run(run_id)
    assert run is not None and run.outcome == "locked" and run.trigger == "manual"
    assert "locked by remediator" in run.detail and "replica-a" in run.detail
    gate.release.set()
    await engine.wait_idle()
    run_id = await by_hand.run_manual(MODEL, dry_run=False)
    assert outcome_of(by_hand, run_id) == "succeeded"
    with pytest.raises(KeyError, match="no model 'nope'"):
        await by_hand.run_manual("nope", dry_run=True)


async def test_the_remediator_metrics_are_registered_with_their_contract_names(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    registry = CollectorRegistry()
    engine = make_engine(
        make_config(tmp_path, "succeeding"), inventory, registry=registry, tmp_path=tmp_path
    )
    engines.append(engine)
    await engine.submit(alert("m"))
    await engine.wait_idle()
    value = registry.get_sample_value
    assert value("mlx_medic_remediations_total", {"model": MODEL, "outcome": "succeeded"}) == 1
    assert value("mlx_medic_remediation_duration_seconds_count", {"model": MODEL}) == 1
    assert value("mlx_medic_remediation_in_progress", {"model": MODEL}) == 0
    backend = "mlx_medic_last_verified_backend"
    assert value(backend, {"model": MODEL, "backend": "ring"}) == 1
    assert value(backend, {"model": MODEL, "backend": "jaccl"}) == 0
    assert value("mlx_medic_pd_debt", {"node": "ai002"}) is None  # the exporter's to serve
    names = {m.name for m in registry.collect()}
    assert {"mlx_medic_remediations", "mlx_medic_escalations"} <= names


# --- two replicas, one head node, real SSH ----------------------------------


@pytest.mark.testbed
async def test_two_replicas_never_act_on_one_model_at_once_over_real_ssh(
    tmp_path: Path, clean_cluster, engines: list[Engine], gate: GatedPlaybook
) -> None:
    cluster = clean_cluster
    model = {
        "name": "tiny",
        "model": "/models/tiny",
        "nodes": ["ai001", "ai002"],
        "port": 18080,
        "service": {"manager": "supervisord", "label": "tiny"},
        "backends": {"ring": {"hostfile": "/etc/ring.json", "pipeline": True}},
        "policy": {"backoff": 0},
    }
    inventory = load_inventory(helper_inventory(cluster, [model], "replicas"))
    transports = [SshTransport(inventory), SshTransport(inventory)]
    replicas = []
    for name, transport in zip(("replica-a", "replica-b"), transports, strict=True):
        config = make_config(tmp_path / name, "gated", lock_wait="1s")  # not the whole run
        replicas.append(
            make_engine(
                config, inventory, playbooks={"gated": gate}, transport=transport, hostname=name
            )
        )
    engines.extend(replicas)
    try:
        same = alert("shared", "tiny")  # both replicas get it, as behind one Alertmanager
        assert await replicas[0].submit(same) == Disposition.STARTED
        await asyncio.wait_for(gate.entered.wait(), 20)
        assert await replicas[1].submit(same) == Disposition.STARTED
        await replicas[1].wait_idle(30)
        (refused,) = replicas[1].journal.list_runs()
        assert refused.outcome == "locked" and refused.steps == []
        assert "locked by remediator" in refused.detail and "replica-a" in refused.detail
        lock = cluster.head.host_path(inventory.state_dir / "locks" / "tiny.lock")
        assert json.loads(lock.read_text())["host"] == "replica-a"
        gate.release.set()
        await replicas[0].wait_idle(30)
        assert outcome_of(replicas[0]) == "succeeded"
        assert not lock.exists()
        # the lock is free again: the other replica acts on the next firing
        assert await replicas[1].submit(alert("next", "tiny")) == Disposition.STARTED
        await replicas[1].wait_idle(30)
        assert outcome_of(replicas[1]) == "succeeded"
    finally:
        for engine in replicas:
            await engine.close()
        for transport in transports:
            await transport.close()


# --- property: single flight whatever the mix of deliveries ---------------------

_deliveries = st.lists(
    st.tuples(
        st.sampled_from([MODEL, OTHER, "not-in-inventory"]),
        st.sampled_from(["f1", "f2", "f3", "f4"]),
        st.sampled_from([AlertStatus.FIRING, AlertStatus.FIRING, AlertStatus.RESOLVED]),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(deliveries=_deliveries)
def test_any_mix_of_concurrent_deliveries_starts_at_most_one_run_per_model(
    tmp_path_factory: pytest.TempPathFactory, deliveries: list[tuple[str, str, AlertStatus]]
) -> None:
    tmp_path = tmp_path_factory.mktemp("mix")

    async def scenario() -> None:
        gate = GatedPlaybook()
        engine = make_engine(
            make_config(tmp_path, "gated"),
            make_inventory(),
            playbooks={"gated": gate},
            tmp_path=tmp_path,
        )
        try:
            results = await asyncio.gather(
                *(
                    engine.submit(alert(f"{model}-{fp}", model, status=status))
                    for model, fp, status in deliveries
                )
            )
            runs = engine.journal.list_runs(limit=1000)
            for model in (MODEL, OTHER):
                started = [
                    r
                    for r, (m, _, _) in zip(results, deliveries, strict=True)
                    if m == model and r == Disposition.STARTED
                ]
                of_model = [run for run in runs if run.model == model]
                assert len(of_model) == len(started)
                # a resolved alert may cancel a queued run; then the next firing starts anew
                assert len([run for run in of_model if run.outcome != "cancelled"]) <= 1
            assert all(
                r in (Disposition.UNKNOWN_MODEL, Disposition.RESOLVED)
                for r, (m, _, _) in zip(results, deliveries, strict=True)
                if m == "not-in-inventory"
            )
        finally:
            gate.release.set()
            await engine.close()

    asyncio.run(scenario())


async def test_a_queued_run_stays_while_another_of_its_alerts_still_fires(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(up=False)
    health.gate = asyncio.Event()
    engine = make_engine(
        make_config(tmp_path, "succeeding"), inventory, health=health, tmp_path=tmp_path
    )
    engines.append(engine)
    assert await engine.submit(alert("first")) == Disposition.STARTED
    assert await engine.submit(alert("second")) == Disposition.ABSORBED
    await engine.submit(alert("first", status=AlertStatus.RESOLVED))
    assert "stays queued" in engine.journal.list_events(kind="resolved")[0].detail
    await engine.submit(alert("second", status=AlertStatus.RESOLVED))
    await engine.wait_idle()
    assert outcome_of(engine) == "cancelled"


def acting(engine: Engine) -> int:
    """How many models have a run acting now (mlx_medic_remediation_in_progress)."""
    return sum(int(engine.m_in_progress.labels(model=m)._value.get()) for m in (MODEL, OTHER))


@pytest.mark.parametrize("bound", [1, 2])
async def test_runs_of_different_models_act_at_once_up_to_max_parallel_runs(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], gate: GatedPlaybook, bound: int
) -> None:
    """Both models are down: with room for two runs both act; with room for one the other
    waits, queued, and acts once the first has ended. Each model is recovered once."""
    config = make_config(tmp_path, "gated", max_parallel_runs=bound)
    engine = make_engine(config, inventory, playbooks={"gated": gate}, tmp_path=tmp_path)
    engines.append(engine)
    for model in (MODEL, OTHER):
        assert await engine.submit(alert(f"down-{model}", model=model)) == Disposition.STARTED
    await asyncio.wait_for(gate.entered.wait(), 5)
    for _ in range(100):  # until the runs that may act have taken their locks
        if acting(engine) == bound:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert acting(engine) == bound
    gate.release.set()
    await engine.wait_idle()
    runs = engine.journal.list_runs()
    assert sorted((r.model, r.outcome) for r in runs) == [
        (MODEL, "succeeded"),
        (OTHER, "succeeded"),
    ]
