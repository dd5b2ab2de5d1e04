"""`sweep-orphans`, run by the engine with scripted node helpers: it sweeps only the orphans
of the nodes that report them while the model serves (no stop, no start), names an
unkillable one once with the node to reboot (a journaled warning: no escalation, no
circuit; the node's exporter pages for the reboot), has a budget of its own, and a
model-down alert that arrives meanwhile is queued after it, never absorbed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import (
    FLAG_FOUND_BY,
    ConfigFileError,
    ConfigSource,
    RemediatorConfig,
    read_config,
)
from mlx_medic.remediator.decision import PAST_LAST_CHECK
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.playbooks import (
    SWEEP_ORPHANS,
    RecoverPlaybook,
    SweepOrphansPlaybook,
    builtin_playbooks,
)
from mlx_medic.remediator.run_survivors import UnkillableRecord
from mlx_medic.remediator.steps import describe_plan
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import (
    MODEL,
    Health,
    alert,
    make_config,
    make_engine,
    make_inventory,
)
from tests.remediator.fake_helpers import Answer, FakeHelpers, stuck, swept, unreachable

ORPHAN = {
    "pid": 31,
    "start_time": 5.0,
    "cmdline": ["python", "-m", "mlx_lm.server"],
    "model": MODEL,
    "role": "rank",
    "state": "S",
    "rule": "launcher_gone",
}
STUCK = {**ORPHAN, "pid": 32, "state": "D"}
WINDOW = 30.0
ROUTING = {"LLMModelDown": "recover", "MLXOrphanProcesses": SWEEP_ORPHANS}


def orphans(*entries: dict[str, Any]) -> Answer:
    return Answer({"orphans": list(entries), "suspects": []})


def reported(*entries: dict[str, Any]) -> list[Answer]:
    """What `node orphans` answers: `entries` at the re-check, none once swept."""
    return [orphans(*entries), orphans()]


def engine_with(
    tmp_path: Path,
    engines: list[Engine],
    answers: dict[tuple[str, str], Any],
    health: Health | None = None,
    sleeps: list[float] | None = None,
    playbook: SweepOrphansPlaybook | None = None,
    **policy: Any,
) -> tuple[Engine, FakeHelpers]:
    """`sleeps`: the windows confirm-clean waits (recorded, not waited)."""
    inventory = make_inventory(start_timeout="1s", **policy)
    config = make_config(tmp_path, routing={"playbooks": ROUTING})
    engine = make_engine(
        config,
        inventory,
        transport=LocalTransport(),
        playbooks={
            "recover": RecoverPlaybook(),
            SWEEP_ORPHANS: playbook or sweep_orphans(sleeps),
        },
        health=health or Health(up=True),
    )
    engines.append(engine)
    helpers = FakeHelpers(inventory, answers)
    engine.helpers = helpers
    return engine, helpers


def sweep_orphans(sleeps: list[float] | None = None) -> SweepOrphansPlaybook:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        await asyncio.sleep(0)

    return SweepOrphansPlaybook(clean_window=WINDOW, sleep=sleep)


def orphan_alert(fingerprint: str, node: str = "ai002") -> Any:
    return alert(fingerprint, alertname="MLXOrphanProcesses", labels={"node": node})


async def test_it_sweeps_the_orphans_of_the_reporting_node_then_of_the_others_never_the_model(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(tmp_path, engines, {("ai002", "orphans"): reported(ORPHAN)})
    assert await engine.submit(orphan_alert("o1")) == Disposition.STARTED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert (run.playbook, run.outcome) == (SWEEP_ORPHANS, "succeeded")
    assert [(s.name, s.node) for s in run.steps] == [
        ("sweep-orphans", "ai002"),
        ("sweep-orphans", "ai001, ai003, ai004"),
        ("confirm-clean", "ai001, ai002, ai003, ai004"),
        ("verify", "ai001"),
    ]
    # the re-check asks who reported; confirm-clean asks every node, twice a window apart
    every = [(node, (MODEL,)) for node in ("ai001", "ai002", "ai003", "ai004")]
    assert helpers.of("orphans") == [("ai002", (MODEL,)), *every, *every]
    sweeps = helpers.of("sweep")
    assert sweeps[0] == ("ai002", (MODEL, "--orphans-only"))  # the reporting node first
    assert sorted(sweeps[1:]) == [
        (node, (MODEL, "--orphans-only")) for node in ("ai001", "ai003", "ai004")
    ]
    assert helpers.of("service") == [] and helpers.of("clean") == []


async def test_nothing_is_done_when_the_node_no_longer_reports_orphans(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(tmp_path, engines, {})
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "skipped" and run.detail == f"no orphans of {MODEL} left on ai002"
    assert helpers.of("sweep") == []


async def test_a_reporting_node_that_cannot_be_asked_ends_the_run_unreachable(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(
        tmp_path, engines, {("ai002", "orphans"): unreachable("ai002", "orphans")}
    )
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "unreachable" and helpers.of("sweep") == []


async def test_an_unkillable_orphan_is_named_once_with_its_reboot_and_the_model_keeps_serving(
    tmp_path: Path, engines: list[Engine]
) -> None:
    stuck_sweep = swept(stuck(32, start_time=5.0))
    engine, helpers = engine_with(
        tmp_path, engines, {("ai002", "orphans"): orphans(STUCK), ("ai002", "sweep"): stuck_sweep}
    )
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (first,) = engine.journal.list_runs()
    advice = f"reboot ai002 to free 1 protection domain(s) (models placed there: {MODEL})"
    assert first.outcome == "succeeded" and first.next_action is None
    assert [(s.name, s.outcome) for s in first.steps] == [
        ("sweep-orphans", "ok"),
        ("sweep-orphans", "ok"),
        ("confirm-clean", "ok"),
        ("verify", "ok"),
    ]
    assert first.detail == (
        f"{MODEL} verified healthy; survivors left: ai002: pid 32 (rank, state uninterruptible,"
        " holding 1 protection domain(s) on rdma_en2) survives SIGKILL: python -m"
        f" mlx_lm.server. {advice}"
    )
    assert f"{advice}; the model keeps serving" in first.steps[0].detail
    assert helpers.of("service") == []  # never stopped
    assert engine.journal.list_events(kind="escalation") == []
    assert engine.journal.blocking_control(MODEL) is None  # recover may still act
    assert engine.m_unkillable.labels(model=MODEL, node="ai002")._value.get() == 1
    (event,) = engine.journal.list_events(kind="unkillable")  # the journaled warning
    assert event.detail.startswith(f"1 process(es) on ai002 survive SIGKILL (pids 32); {advice}")
    # Alertmanager's next notification (a new firing of the same orphan): nothing to do.
    await engine.submit(orphan_alert("o2"))
    await engine.wait_idle()
    second = engine.journal.list_runs()[0]
    assert second.outcome == "skipped"
    assert "only 1 an earlier run found unkillable and named" in second.detail
    assert len(helpers.of("sweep")) == 4  # the first run's, on ai002 then the others: no more
    # A fresh orphan beside it: swept, and the survivor is counted, not named again.
    helpers.answers[("ai002", "orphans")] = [orphans(STUCK, ORPHAN), orphans(STUCK)]
    await engine.submit(orphan_alert("o3"))
    await engine.wait_idle()
    third = engine.journal.list_runs()[0]
    assert third.outcome == "succeeded" and third.detail == f"{MODEL} verified healthy"
    assert "1 unkillable process(es) an earlier run named, left alone" in third.steps[0].detail
    assert len(engine.journal.list_events(kind="unkillable")) == 1
    assert engine.journal.list_events(kind="escalation") == []
    for reason in ("unrecoverable", "step_failed", "budget_spent"):
        assert engine.m_escalations.labels(model=MODEL, reason=reason)._value.get() == 0


async def test_its_runs_have_a_budget_of_their_own_that_never_blocks_recover(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, _ = engine_with(
        tmp_path,
        engines,
        {("ai002", "orphans"): reported(ORPHAN)},
        health=Health(up=True),
        restart_budget=1,
    )
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    assert await engine.submit(orphan_alert("o2")) == Disposition.BACKOFF
    assert (
        "sweep-orphans: restart budget spent"
        in engine.journal.list_events(kind="backoff")[0].detail
    )
    assert engine.journal.blocking_control(MODEL) is None
    engine._health_check = Health(
        verdicts=[HealthVerdict.down("refused")] * 2 + [HealthVerdict.up("answered")]
    )
    assert await engine.submit(alert("down1")) == Disposition.STARTED  # recover's own budget


async def test_a_model_down_alert_during_a_sweep_is_queued_after_it_not_absorbed(
    tmp_path: Path, engines: list[Engine]
) -> None:
    health = Health(
        verdicts=[
            HealthVerdict.up("answered"),  # the sweep's re-check
            HealthVerdict.up("answered"),  # the sweep's verify
            HealthVerdict.down("refused"),  # recover's re-check
            HealthVerdict.up("answered"),
        ]
    )  # recover's verify
    engine, helpers = engine_with(
        tmp_path, engines, {("ai002", "orphans"): reported(ORPHAN)}, health=health
    )
    helpers.gates["sweep"] = gate = asyncio.Event()
    assert await engine.submit(orphan_alert("o1")) == Disposition.STARTED
    while not helpers.of("sweep"):
        await asyncio.sleep(0.01)
    assert await engine.submit(alert("down1")) == Disposition.STARTED
    assert await engine.submit(alert("down2")) == Disposition.ABSORBED  # into recover's run
    gate.set()
    await engine.wait_idle()
    recover, sweep = engine.journal.list_runs()
    assert (sweep.playbook, sweep.outcome) == (SWEEP_ORPHANS, "succeeded")
    assert (recover.playbook, recover.outcome) == ("recover", "succeeded")
    assert recover.started_at is not None and sweep.ended_at is not None
    assert recover.started_at >= sweep.ended_at


def ended_ok(step: Any) -> str:
    """The detail of a step that ended ok."""
    assert step.outcome == "ok", step.detail
    return str(step.detail)


async def sweep_started(
    tmp_path: Path, engines: list[Engine], health: Health, sleep: Any, **playbook: Any
) -> Engine:
    """An engine whose sweep-orphans waits its window with `sleep`, with ai002's orphan
    alert submitted (its run started)."""
    sweep = SweepOrphansPlaybook(clean_window=WINDOW, sleep=sleep, **playbook)
    engine, _ = engine_with(
        tmp_path, engines, {("ai002", "orphans"): reported(ORPHAN)}, health, playbook=sweep
    )
    assert await engine.submit(orphan_alert("o1")) == Disposition.STARTED
    return engine


async def test_a_model_down_alert_during_the_clean_window_ends_it_and_recover_acts_at_once(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The window is no wait for a model that went down: recover stops, sweeps every node
    and starts, so confirm-clean ends its check as soon as recover is queued."""
    waiting = asyncio.Event()

    async def a_long_window(seconds: float) -> None:
        waiting.set()
        await asyncio.Event().wait()  # never over: only recover's queueing ends it

    health = Health(
        verdicts=[
            HealthVerdict.up("answered"),  # the sweep's re-check
            HealthVerdict.down("refused"),  # the sweep's verify: it went down meanwhile
            HealthVerdict.down("refused"),  # recover's re-check
            HealthVerdict.up("answered"),  # recover's verify
        ]
    )
    engine = await sweep_started(tmp_path, engines, health, a_long_window)
    await asyncio.wait_for(waiting.wait(), 10)
    assert await engine.submit(alert("down1")) == Disposition.STARTED
    await asyncio.wait_for(engine.wait_idle(), 10)
    recover, sweep = engine.journal.list_runs()
    assert (recover.playbook, recover.outcome) == ("recover", "succeeded")
    assert ended_ok(confirm_clean(sweep)).endswith(
        f"another run of {MODEL} is queued to act after this one and sweeps again (recover,"
        " for a model that went down, or a sweep of nodes this run does not act on): the"
        " check ends here"
    )


async def test_a_model_that_stops_answering_during_the_clean_window_ends_it_and_the_run(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The run holds the model lock, which a restart of the serve wrapper needs: a serving
    model that stops answering ends the window (probed meanwhile), and with it the run."""

    async def a_long_window(seconds: float) -> None:
        await asyncio.Event().wait()  # never over: only the probe's verdict ends it

    health = Health(
        verdicts=[
            HealthVerdict.up("answered"),  # the sweep's re-check: serving
            HealthVerdict.down("refused"),  # the window's first probe
            HealthVerdict.down("refused"),  # the sweep's verify
        ]
    )
    engine = await sweep_started(tmp_path, engines, health, a_long_window, health_poll=0.01)
    await asyncio.wait_for(engine.wait_idle(), 10)
    (run,) = engine.journal.list_runs()
    assert run.ended_at is not None
    assert ended_ok(confirm_clean(run)).endswith(
        f"{MODEL} stopped answering during the window (refused): the check ends here, so the"
        " run lets go of the model lock for the service's restart (its start sweep) or"
        " LLMModelDown's recover"
    )


async def test_an_orphan_alert_for_another_node_during_a_sweep_gets_a_sweep_of_its_own(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(
        tmp_path,
        engines,
        {
            ("ai002", "orphans"): reported(ORPHAN),
            # clean in the first run's check (the second run, queued, ends its window);
            # reported at the second run's re-check
            ("ai003", "orphans"): [orphans(), *reported(ORPHAN)],
        },
    )
    helpers.gates["sweep"] = gate = asyncio.Event()
    assert await engine.submit(orphan_alert("o1", "ai002")) == Disposition.STARTED
    while not helpers.of("sweep"):  # the first run's nodes are fixed: it sweeps ai002
        await asyncio.sleep(0.01)
    assert await engine.submit(orphan_alert("o2", "ai002")) == Disposition.ABSORBED
    ai003 = orphan_alert("o3", "ai003")
    assert await engine.submit(ai003) == Disposition.STARTED
    gate.set()
    await engine.wait_idle()
    second, first = engine.journal.list_runs()
    assert (first.outcome, second.outcome) == ("succeeded", "succeeded")
    assert second.started_at is not None and first.ended_at is not None
    assert second.started_at >= first.ended_at
    assert (first.steps[0].node, second.steps[0].node) == ("ai002", "ai003")
    started = engine.journal.list_events(kind="started")[0].detail
    assert f"after run {first.id} (that run acts only on the nodes it started with)" in started
    assert await engine.submit(ai003) == Disposition.DUPLICATE  # held by the run that swept it


class VerifyHeld(Health):
    """Serving; the run's verify (the second probe: the first is its re-check) is held
    until `release` is set, `verifying` set meanwhile."""

    def __init__(self) -> None:
        super().__init__(up=True)
        self.verifying, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, model: Any) -> HealthVerdict:
        self.calls += 1
        if self.calls == 2:
            self.verifying.set()
            await self.release.wait()
        return HealthVerdict.up("answered")


async def test_an_orphan_alert_after_the_last_clean_check_gets_a_sweep_of_its_own(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """Orphans that appear after confirm-clean's last check make a new firing. The run
    will not look at its nodes again, so that firing is not absorbed (it would be held,
    never acted on): its run is queued after this one and sweeps them."""
    health = VerifyHeld()
    engine, helpers = engine_with(
        tmp_path,
        engines,
        # the first run: reported, then clean twice; the second run's re-check: reported
        {("ai002", "orphans"): [orphans(ORPHAN), orphans(), orphans(), *reported(ORPHAN)]},
        health,
    )
    assert await engine.submit(orphan_alert("o1")) == Disposition.STARTED
    await asyncio.wait_for(health.verifying.wait(), 10)  # past the last clean check
    later = orphan_alert("o2")
    assert await engine.submit(later) == Disposition.STARTED
    health.release.set()
    await asyncio.wait_for(engine.wait_idle(), 10)
    second, first = engine.journal.list_runs()
    assert (first.outcome, second.outcome) == ("succeeded", "succeeded")
    assert second.started_at is not None and first.ended_at is not None
    assert second.started_at >= first.ended_at
    started = engine.journal.list_events(kind="started")[0].detail
    assert f"after run {first.id} ({PAST_LAST_CHECK})" in started
    assert [args for node, args in helpers.of("sweep") if node == "ai002"] == [
        (MODEL, "--orphans-only")
    ] * 2  # each run swept the reporting node
    assert await engine.submit(later) == Disposition.DUPLICATE  # held by the run that swept


async def test_orphan_alerts_for_two_nodes_before_the_run_starts_are_swept_by_one_run(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine, helpers = engine_with(
        tmp_path,
        engines,
        {("ai002", "orphans"): reported(ORPHAN), ("ai003", "orphans"): reported(ORPHAN)},
    )
    assert await engine.submit(orphan_alert("o1", "ai002")) == Disposition.STARTED
    assert await engine.submit(orphan_alert("o3", "ai003")) == Disposition.ABSORBED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded" and run.steps[0].node == "ai002, ai003"
    assert sorted(node for node, _ in helpers.of("sweep")) == ["ai001", "ai002", "ai003", "ai004"]


async def test_a_model_that_stops_answering_during_the_sweep_is_left_to_llmmodeldown(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The sweep spares the port's process and ends only orphans, so a model that answered
    at the re-check and not after the sweep crashed during the run (the whole loop showed
    it: a second fault while the first one's orphans were swept). The run does not page:
    it says so, and LLMModelDown's recover acts; no circuit opens."""
    engine, _ = engine_with(
        tmp_path,
        engines,
        {("ai002", "orphans"): reported(ORPHAN)},
        health=Health(verdicts=[HealthVerdict.up("answered"), HealthVerdict.down("refused")]),
    )
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded" and run.next_action is None
    assert [(s.name, s.outcome) for s in run.steps][-1] == ("verify", "skipped")
    assert run.detail.startswith(
        "sweep-orphans on ai002, sweep-orphans on ai001, ai003, ai004, confirm-clean on"
        f" ai001, ai002, ai003, ai004 done; {MODEL} answered before the sweep and not after it"
        " (refused)"
    )
    assert "reads as a crash during the run; LLMModelDown acts" in run.detail
    assert engine.journal.blocking_control(MODEL) is None
    assert engine.journal.list_events(kind="escalation") == []


async def test_a_model_that_was_not_answering_before_the_sweep_is_left_to_llmmodeldown(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """A crash in progress (KeepAlive restarting the model): the orphans are swept, the
    verify judges nothing the sweep did, the run succeeds and nothing escalates."""
    engine, _ = engine_with(
        tmp_path,
        engines,
        {("ai002", "orphans"): reported(ORPHAN)},
        health=Health(verdicts=[HealthVerdict.down("refused")]),
    )
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == "succeeded" and run.next_action is None
    assert [(s.name, s.outcome) for s in run.steps] == [
        ("sweep-orphans", "ok"),
        ("sweep-orphans", "ok"),
        ("confirm-clean", "ok"),
        ("verify", "skipped"),
    ]
    assert run.detail.startswith(
        "sweep-orphans on ai002, sweep-orphans on ai001, ai003, ai004, confirm-clean on"
        f" ai001, ai002, ai003, ai004 done; {MODEL} was not answering before the sweep"
    )
    assert "LLMModelDown acts on a model that stays down" in run.detail


# --- confirm-clean: the run ends only once its nodes were seen clean a window apart -------

HEAD_SSH = {**ORPHAN, "pid": 41, "start_time": 7.0, "role": "ssh", "rule": "launcher_gone"}
EVERY = ("ai001", "ai002", "ai003", "ai004")


async def one_run(
    tmp_path: Path,
    engines: list[Engine],
    answers: dict[tuple[str, str], Any],
    sleeps: list[float] | None = None,
    unkillable_named: str | None = None,
) -> tuple[Any, Engine, FakeHelpers]:
    """The run of one orphan alert from ai002 (ended), with `answers` scripted, after an
    earlier run's `unkillable` event (its detail) if given."""
    engine, helpers = engine_with(tmp_path, engines, answers, sleeps=sleeps)
    if unkillable_named is not None:
        engine.journal.add_event("unkillable", now=1.0, model=MODEL, detail=unkillable_named)
    await engine.submit(orphan_alert("o1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    return run, engine, helpers


def confirm_clean(run: Any) -> Any:
    (step,) = [s for s in run.steps if s.name == "confirm-clean"]
    return step


async def test_it_ends_once_its_nodes_are_clean_twice_a_window_apart(
    tmp_path: Path, engines: list[Engine]
) -> None:
    sleeps: list[float] = []
    run, _, helpers = await one_run(
        tmp_path, engines, {("ai002", "orphans"): reported(ORPHAN)}, sleeps=sleeps
    )
    assert run.outcome == "succeeded"
    assert sleeps == [WINDOW]  # one window between the two clean checks
    step = confirm_clean(run)
    assert step.outcome == "ok"
    assert step.detail == (
        f"check 1: no orphans on {', '.join(EVERY)}; check 2: clean again 30s later:"
        " Prometheus has seen no orphans, so the orphan alert resolves"
    )
    assert len(step.output.splitlines()) == 2 * len(EVERY)  # each node's answer, each check
    assert len(helpers.of("sweep")) == 4  # no re-sweep


async def test_orphans_that_come_back_within_the_window_are_swept_and_the_window_starts_again(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The loop's flake: a second crash of the launch leaves the head's ssh clients after
    the sweep, before Prometheus saw zero: the run sweeps them itself (no new firing would
    come for them)."""
    sleeps: list[float] = []
    run, engine, helpers = await one_run(
        tmp_path,
        engines,
        {
            ("ai002", "orphans"): reported(ORPHAN),
            ("ai001", "orphans"): [orphans(), orphans(HEAD_SSH), orphans()],
        },
        sleeps=sleeps,
    )
    assert run.outcome == "succeeded" and run.detail == f"{MODEL} verified healthy"
    assert sleeps == [WINDOW, WINDOW]  # clean, (window), orphans, re-sweep, clean, (window)
    step = confirm_clean(run)
    assert step.detail.startswith(
        f"check 1: no orphans on {', '.join(EVERY)}; check 2: orphans again: ai001: pid 41"
        " (launcher_gone); re-sweep 1 of 3; re-sweep 1: ai001: 0 signalled"
    )
    assert step.detail.endswith(
        f"; check 3: no orphans on {', '.join(EVERY)}; check 4: clean"
        " again 30s later: Prometheus has seen no orphans, so the orphan"
        " alert resolves"
    )
    assert helpers.of("sweep")[-1] == ("ai001", (MODEL, "--orphans-only"))
    assert len(helpers.of("sweep")) == 5
    assert engine.journal.list_events(kind="escalation") == []


async def test_orphans_that_keep_coming_back_end_the_run_escalated_after_three_re_sweeps(
    tmp_path: Path, engines: list[Engine]
) -> None:
    run, engine, helpers = await one_run(
        tmp_path,
        engines,
        {("ai002", "orphans"): reported(ORPHAN), ("ai001", "orphans"): orphans(HEAD_SSH)},
    )
    assert run.outcome == "escalated"
    assert [(s.name, s.outcome) for s in run.steps][-1] == ("confirm-clean", "failed")
    assert "orphans keep coming back after 3 re-sweep(s): ai001: pid 41 (launcher_gone)" in (
        run.detail
    )
    assert run.next_action is not None
    assert run.next_action.startswith(f"find what keeps leaving orphans of {MODEL} on ai001")
    step = confirm_clean(run)
    for n in (1, 2, 3):
        assert f"re-sweep {n} of 3" in step.detail
    # the others' sweep, then three re-sweeps of ai001 alone; never a fourth
    assert [node for node, _ in helpers.of("sweep")].count("ai001") == 4
    (escalation,) = engine.journal.list_events(kind="escalation")  # on-call is told
    assert (
        escalation.detail.startswith("unrecoverable: ") and "keep coming back" in escalation.detail
    )
    assert engine.journal.blocking_control(MODEL) is None  # its own budget: no circuit


async def test_orphans_an_earlier_run_found_unkillable_do_not_count(
    tmp_path: Path, engines: list[Engine]
) -> None:
    sleeps: list[float] = []
    run, _, helpers = await one_run(
        tmp_path,
        engines,
        {("ai002", "orphans"): [orphans(STUCK, ORPHAN), orphans(STUCK)]},
        sleeps=sleeps,
        unkillable_named=UnkillableRecord.of("ai002", [(32, 5.0)]).to_detail("reboot ai002"),
    )
    assert run.outcome == "succeeded" and sleeps == [WINDOW]
    step = confirm_clean(run)
    assert step.outcome == "ok"
    assert "(1 unkillable one(s) already named left out)" in step.detail
    assert "orphans again" not in step.detail
    assert len(helpers.of("sweep")) == 4


@pytest.mark.parametrize("window", ["0s", "-5s", "soon"])
def test_a_bad_orphans_clean_window_is_a_config_error_naming_the_key(
    tmp_path: Path, window: str
) -> None:
    path = tmp_path / "remediator.yml"
    path.write_text(yaml.safe_dump({"orphans_clean_window": window}))
    with pytest.raises(ConfigFileError) as error:
        read_config(ConfigSource(path, FLAG_FOUND_BY))
    assert "orphans_clean_window" in error.value.report()


def test_the_configured_window_is_the_one_sweep_orphans_waits() -> None:
    config = RemediatorConfig.model_validate({"orphans_clean_window": "2500ms"})
    playbook = builtin_playbooks(config)[SWEEP_ORPHANS]
    assert isinstance(playbook, SweepOrphansPlaybook) and playbook.clean_window == 2.5
    plan = playbook.plan_for(make_inventory().model(MODEL), make_inventory(), ("ai002",))
    assert "two checks 2.5s apart" in describe_plan(plan)[-2].description
    assert SweepOrphansPlaybook().clean_window == 30.0  # the rendered 15s scrape + 15s eval
