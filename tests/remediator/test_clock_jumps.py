"""A clock jump on the remediator (an injected wall clock, never the machine's): a firing
is acted on once whatever the clock does, the budget's window is wall time (as the journal
persists it), a backoff is never longer than configured, and the lock stays held."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from mlx_medic.inventory.schema import Inventory
from mlx_medic.model_lock import LockHandle, ModelLocks, lock_path
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.budget import Budget
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import (
    MODEL,
    Clock,
    GatedPlaybook,
    acted,
    alert,
    make_config,
    make_engine,
    make_inventory,
)

HOUR = 3600.0


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.sqlite")


async def test_a_firing_is_acted_on_once_whatever_the_wall_clock_does(
    tmp_path: Path, engines: list[Engine]
) -> None:
    inventory = make_inventory()
    clock = Clock(time.time())
    gate = GatedPlaybook()
    engine = make_engine(
        make_config(tmp_path, "gated"),
        inventory,
        playbooks={"gated": gate},
        tmp_path=tmp_path,
        clock=clock,
    )
    engines.append(engine)
    firing = alert("jumpy")
    assert await engine.submit(firing) == Disposition.STARTED
    await asyncio.wait_for(gate.entered.wait(), 5)
    for jump in (5 * HOUR, -10 * HOUR):  # inside the run
        clock.now += jump
        assert await engine.submit(firing) == Disposition.DUPLICATE
    gate.release.set()
    await engine.wait_idle()
    for jump in (20 * HOUR, -30 * HOUR):  # after it
        clock.now += jump
        assert await engine.submit(firing) == Disposition.DUPLICATE
    assert [run.outcome for run in engine.journal.list_runs()] == ["succeeded"]


def test_a_forward_jump_inside_the_window_leaves_its_runs_counted(journal: Journal) -> None:
    model = make_inventory(restart_budget=2, window="6h", backoff=0).model(MODEL)
    clock = Clock(100_000.0)
    budget = Budget(journal, clock)
    acted(journal, clock.now)
    acted(journal, clock.now + 60)
    clock.now += 3 * HOUR
    decision = budget.check(model)
    assert decision.spent and decision.runs_in_window == 2
    clock.now += 4 * HOUR  # past the window: the wall clock says they aged out
    assert budget.check(model).allowed


def test_a_backward_jump_never_lengthens_the_backoff_nor_counts_a_run_twice(
    journal: Journal,
) -> None:
    model = make_inventory(restart_budget=5, window="1h", backoff="30s").model(MODEL)
    clock, monotonic = Clock(100_000.0), Clock(50.0)
    budget = Budget(journal, clock, monotonic)
    acted(journal, clock.now)
    clock.now -= 3 * HOUR  # the run now lies three hours in the wall clock's future
    decision = budget.check(model)
    assert not decision.allowed and decision.runs_in_window == 1
    assert 0 < decision.retry_after <= 30
    clock.now += 20
    monotonic.now += 20
    assert 0 < budget.check(model).retry_after <= 10
    clock.now += 11
    monotonic.now += 11
    decision = budget.check(model)
    assert decision.allowed and decision.runs_in_window == 1
    acted(journal, clock.now)  # a second run, stamped by the clock as it is now
    decision = budget.check(model)
    assert decision.runs_in_window == 2 and 59 < decision.retry_after <= 60
    monotonic.now += 61
    assert budget.check(model).allowed


async def test_the_lock_stays_held_across_jumps_and_its_lease_follows_the_clock(
    inventory: Inventory,
) -> None:
    clock = Clock(1_000_000.0)
    # lease 3 s: renewed every second, on the event loop's monotonic clock
    locks = ModelLocks(
        inventory, LocalTransport(), this_node=None, hostname="replica-a", clock=clock, lease=3
    )
    handle = await locks.acquire(MODEL, "remediator", "1")
    assert isinstance(handle, LockHandle)
    path = lock_path(inventory.state_dir, MODEL)
    try:
        for jump in (5 * HOUR, -10 * HOUR):
            clock.now += jump
            deadline = time.monotonic() + 10
            while json.loads(path.read_text())["expires"] != clock.now + 3:  # renewed
                assert time.monotonic() < deadline, "the lease was not renewed"
                await asyncio.sleep(0.1)
            assert json.loads(path.read_text())["token"] == handle.info.token
            assert await locks.renew(handle)
    finally:
        await locks.release(handle)
    assert not path.exists()


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory()
