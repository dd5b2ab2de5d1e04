"""The restart budget, its growing backoff, and escalation with notification."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from mlx_medic.remediator.budget import Budget, Escalator
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.outcomes import EscalationReason
from tests.remediator.engine_fakes import MODEL, Clock, acted, make_inventory


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.sqlite")


def test_runs_are_allowed_until_the_budget_is_spent_within_the_window(journal: Journal) -> None:
    model = make_inventory(restart_budget=3, window="1h", backoff=0).model(MODEL)
    clock = Clock()
    budget = Budget(journal, clock)
    for _ in range(3):
        assert budget.check(model).allowed
        acted(journal, clock.now)
        clock.now += 60
    decision = budget.check(model)
    assert decision.spent and not decision.allowed
    assert "restart budget spent: 3 run(s)" in decision.reason and "last 1h" in decision.reason
    clock.now += 3600  # the window moved past all three
    assert budget.check(model).allowed


def test_backoff_doubles_with_each_run_in_the_window(journal: Journal) -> None:
    model = make_inventory(restart_budget=5, window="1h", backoff="30s").model(MODEL)
    clock = Clock()
    budget = Budget(journal, clock)
    waits = []
    for _ in range(4):
        acted(journal, clock.now)
        decision = budget.check(model)
        assert not decision.allowed and not decision.spent
        waits.append(round(decision.retry_after))
        clock.now += decision.retry_after + 0.001
        assert budget.check(model).allowed
    assert waits == [30, 60, 120, 240]


def test_runs_that_did_not_act_do_not_spend_the_budget(journal: Journal) -> None:
    model = make_inventory(restart_budget=1).model(MODEL)
    journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="alert", owner="h:1", now=100_000.0
    )  # skipped, locked or dry run: never counted
    assert Budget(journal, Clock()).check(model).allowed


def test_closing_the_circuit_by_hand_starts_a_fresh_budget(journal: Journal) -> None:
    model = make_inventory(restart_budget=1).model(MODEL)
    clock = Clock()
    acted(journal, clock.now)
    assert Budget(journal, clock).check(model).spent
    clock.now += 1
    journal.close_circuit(MODEL, clock.now)
    assert Budget(journal, clock).check(model).allowed


def counter(registry: CollectorRegistry) -> Counter:
    return Counter("mlx_medic_escalations_total", "x", ["model", "reason"], registry=registry)


async def test_an_escalation_opens_the_circuit_counts_and_posts_to_the_notify_url(
    journal: Journal, unused_tcp_port: int
) -> None:
    received: list[dict] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/page", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        registry = CollectorRegistry()
        escalator = Escalator(
            journal,
            counter(registry),
            hostname="replica-a",
            notify_url=f"http://127.0.0.1:{unused_tcp_port}/page",
        )
        next_action = "check that ai002 is up and answers SSH, reboot it if it hangs"
        assert escalator.escalate(
            MODEL, EscalationReason.UNRECOVERABLE, "ai002 hangs", next_action, run_id=3
        )
        assert not escalator.escalate(MODEL, EscalationReason.UNRECOVERABLE, "again", next_action)
        await escalator.drain()
    finally:
        await runner.cleanup()
    control = journal.blocking_control(MODEL)
    assert control is not None and control.kind == "circuit"
    assert control.next_action == next_action
    assert (
        registry.get_sample_value(
            "mlx_medic_escalations_total", {"model": MODEL, "reason": "unrecoverable"}
        )
        == 2
    )
    assert received[0]["model"] == MODEL and received[0]["next_action"] == next_action
    assert received[0]["run_id"] == 3
    assert [e.kind for e in journal.list_events(kind="notified")] == ["notified", "notified"]


async def test_a_failing_notify_url_is_journaled_and_never_raises(
    journal: Journal, unused_tcp_port: int
) -> None:
    escalator = Escalator(
        journal,
        counter(CollectorRegistry()),
        notify_url=f"http://127.0.0.1:{unused_tcp_port}/nobody-listens",
        notify_timeout=2.0,
    )
    escalator.escalate(MODEL, EscalationReason.BUDGET_SPENT, "3 runs in 1h", "find out why")
    await asyncio.wait_for(escalator.drain(), 5)
    (failed,) = journal.list_events(kind="notify_failed")
    assert "POST http://127.0.0.1" in failed.detail and failed.model == MODEL


def test_an_unknown_escalation_reason_is_refused(journal: Journal) -> None:
    escalator = Escalator(journal, counter(CollectorRegistry()))
    with pytest.raises(ValueError, match="reason must be one of"):
        escalator.escalate(MODEL, "bored", "x", "y")  # type: ignore[arg-type]
