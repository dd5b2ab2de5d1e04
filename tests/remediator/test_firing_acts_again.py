"""A firing that can act again: dedupe (fingerprint, startsAt) stops only repeats of a
firing whose run is queued or running, or whose run succeeded (a dry run: planned).
Every other ending leaves the same firing able to start a run on a later notification,
within the budget and backoff; and taking the model lock waits a bounded time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.model_health import HealthVerdict
from tests.remediator.engine_fakes import (
    MODEL,
    Health,
    alert,
    hold_lock,
    let_go_once_the_run_waits,
    make_config,
    make_engine,
    make_inventory,
)


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory(restart_budget=5, backoff=0)


def lock_path(tmp_path: Path, inventory: Inventory) -> Path:
    """MODEL's lock on its head (ai001), where the head's `lock` helper (run here) keeps it."""
    return inventory.state_dir / "locks" / f"{MODEL}.lock"


# One firing: the same fingerprint and startsAt, however often Alertmanager sends it.
SAME = alert("again")


async def first_run_ends(engine: Engine, expected: str) -> None:
    assert await engine.submit(SAME) == Disposition.STARTED
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    assert run.outcome == expected, run.detail


Setup = Callable[[Path, Inventory, Engine], Awaitable[None]]


async def _resume(tmp_path: Path, inventory: Inventory, engine: Engine) -> None:
    """`mlx-medic resume MODEL`, from another process's journal handle."""
    Journal(engine.journal.path).close_circuit(MODEL, now=engine.clock())


async def _free_the_lock(tmp_path: Path, inventory: Inventory, engine: Engine) -> None:
    lock_path(tmp_path, inventory).unlink()


async def _nothing(tmp_path: Path, inventory: Inventory, engine: Engine) -> None:
    pass


async def _hold(tmp_path: Path, inventory: Inventory, engine: Engine) -> None:
    hold_lock(inventory)


ENDINGS = [
    # (playbook, first health verdicts, before the first run, first outcome, before the repeat)
    pytest.param("unrecoverable", [], _nothing, "escalated", _resume, id="escalated"),
    pytest.param("succeeding", [], _hold, "locked", _free_the_lock, id="locked"),
    pytest.param(
        "succeeding",
        [HealthVerdict.unreachable("ai001", "could not probe on ai001")],
        _nothing,
        "unreachable",
        _nothing,
        id="unreachable",
    ),
    pytest.param(
        "start-and-verify",
        [HealthVerdict.down("refused"), HealthVerdict.unknown("no answer")],
        _nothing,
        "inconclusive",
        _nothing,
        id="inconclusive",
    ),
    pytest.param(
        "succeeding",
        [HealthVerdict.unknown("probe busy")],
        _nothing,
        "skipped",
        _nothing,
        id="skipped-could-not-tell",
    ),
    pytest.param(
        "succeeding",
        [HealthVerdict.up("completed")],
        _nothing,
        "skipped",
        _nothing,
        id="skipped-up-again",
    ),
]


@pytest.mark.parametrize(("playbook", "verdicts", "before", "outcome", "between"), ENDINGS)
async def test_a_firing_whose_run_did_not_fix_the_model_starts_a_new_run_when_sent_again(
    tmp_path: Path,
    inventory: Inventory,
    engines: list[Engine],
    playbook: str,
    verdicts: list[HealthVerdict],
    before: Setup,
    outcome: str,
    between: Setup,
) -> None:
    engine = make_engine(
        make_config(tmp_path, playbook, lock_wait=0),
        inventory,
        health=Health(up=False, verdicts=verdicts),
        tmp_path=tmp_path,
    )
    engines.append(engine)
    await before(tmp_path, inventory, engine)
    await first_run_ends(engine, outcome)
    await between(tmp_path, inventory, engine)
    assert await engine.submit(SAME) == Disposition.STARTED
    await engine.wait_idle()
    runs = engine.journal.list_runs()
    assert len(runs) == 2
    assert {(r.fingerprint, r.starts_at) for r in runs} == {SAME.dedupe_key}


@pytest.mark.parametrize(
    ("settings", "outcome"), [({}, "succeeded"), ({"dry_run": True}, "planned")]
)
async def test_a_firing_whose_run_succeeded_stays_a_duplicate(
    tmp_path: Path,
    inventory: Inventory,
    engines: list[Engine],
    settings: dict[str, bool],
    outcome: str,
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding", **settings), inventory, tmp_path=tmp_path
    )
    engines.append(engine)
    await first_run_ends(engine, outcome)
    assert await engine.submit(SAME) == Disposition.DUPLICATE
    assert len(engine.journal.list_runs()) == 1


async def test_a_firing_absorbed_by_a_run_that_escalated_acts_after_resume(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(up=False)
    health.gate = asyncio.Event()  # the run stays queued while the second firing arrives
    engine = make_engine(
        make_config(tmp_path, "unrecoverable"), inventory, health=health, tmp_path=tmp_path
    )
    engines.append(engine)
    first, second = alert("first"), alert("second")
    assert await engine.submit(first) == Disposition.STARTED
    assert await engine.submit(second) == Disposition.ABSORBED
    assert await engine.submit(second) == Disposition.DUPLICATE  # held while queued
    health.gate.set()
    await engine.wait_idle()
    assert engine.journal.list_runs()[0].outcome == "escalated"
    assert await engine.submit(second) == Disposition.CIRCUIT_OPEN
    await _resume(tmp_path, inventory, engine)
    assert await engine.submit(second) == Disposition.STARTED
    assert await engine.submit(first) == Disposition.ABSORBED
    await engine.wait_idle()


async def test_after_a_restart_an_escalated_firing_still_acts_once_resumed(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    """The forgetting is in the journal, not only in the process's memory."""
    config = make_config(tmp_path, "unrecoverable")
    first = make_engine(config, inventory, tmp_path=tmp_path)
    engines.append(first)
    await first_run_ends(first, "escalated")
    await first.close()
    second = make_engine(config, inventory, tmp_path=tmp_path)
    engines.append(second)
    await second.start()
    assert await second.submit(SAME) == Disposition.CIRCUIT_OPEN
    await _resume(tmp_path, inventory, second)
    assert await second.submit(SAME) == Disposition.STARTED
    await second.wait_idle()


async def test_the_budget_and_backoff_still_bound_a_firing_that_acts_again(
    tmp_path: Path, engines: list[Engine]
) -> None:
    inventory = make_inventory(restart_budget=5, backoff="10m")
    verdicts = [HealthVerdict.down("refused"), HealthVerdict.unknown("no answer")]
    engine = make_engine(
        make_config(tmp_path, "start-and-verify"),
        inventory,
        health=Health(verdicts=verdicts),
        tmp_path=tmp_path,
    )
    engines.append(engine)
    await first_run_ends(engine, "inconclusive")  # it acted: it spent budget
    assert await engine.submit(SAME) == Disposition.BACKOFF
    assert len(engine.journal.list_runs()) == 1


# --- the bounded wait for the model lock ------------------------------------------------


async def test_a_run_waits_for_a_lock_the_serve_wrapper_releases_then_checks_again(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(up=False)
    engine = make_engine(
        make_config(tmp_path, "succeeding", lock_wait="30s"),
        inventory,
        health=health,
        tmp_path=tmp_path,
    )
    engines.append(engine)
    lock = hold_lock(inventory)
    releasing = let_go_once_the_run_waits(engine, lock)
    await first_run_ends(engine, "succeeded")
    await releasing
    assert health.calls == 2  # the re-check, and again after the wait


async def test_a_run_that_waited_for_the_lock_leaves_a_model_the_holder_fixed_alone(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    health = Health(verdicts=[HealthVerdict.down("refused"), HealthVerdict.up("completed")])
    engine = make_engine(
        make_config(tmp_path, "succeeding", lock_wait="30s"),
        inventory,
        health=health,
        tmp_path=tmp_path,
    )
    engines.append(engine)
    lock = hold_lock(inventory)
    releasing = let_go_once_the_run_waits(engine, lock)
    await first_run_ends(engine, "skipped")
    await releasing
    (run,) = engine.journal.list_runs()
    assert run.detail.startswith("model is up again") and run.steps == []
    assert not lock_path(tmp_path, inventory).exists()  # taken, then released


async def test_a_lock_held_for_all_of_lock_wait_ends_the_run_locked_naming_the_holder(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding", lock_wait="1.5s"), inventory, tmp_path=tmp_path
    )
    engines.append(engine)
    hold_lock(inventory)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await first_run_ends(engine, "locked")
    assert 1.5 <= loop.time() - started < 10
    (run,) = engine.journal.list_runs()
    assert run.detail.startswith("the model lock on ai001: locked by serve (run r1")
