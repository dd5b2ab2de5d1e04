"""A run that could not take the model lock says what happened, the same on the page, in
`mlx-medic log` and in `/api/remediations`: `locked` only when another holder has it (the
head, the holder and what to do), `failed` when the head's lock helper erred (no holder
found; the helper's error and the fix), and in neither case was anything done."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.remediator.cli_log import format_run
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import RunView
from mlx_medic.remediator.webapp import make_app
from mlx_medic.transport import CommandResult, LocalTransport
from tests.remediator.conftest import FakeEngine, bearer
from tests.remediator.engine_fakes import (
    MODEL,
    alert,
    hold_lock,
    make_config,
    make_engine,
    make_inventory,
)

DENIED = "mlx-medic node lock: cannot open /var/lib/mlx-medic/locks: permission denied"


class LockHelperErrs(LocalTransport):
    """The head answers, but its `lock` helper exits 1 with an error on stderr."""

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if argv[1:3] == ["node", "lock"]:
            return CommandResult(1, "", DENIED + "\n")
        return await super().run(node, argv, timeout=timeout)


async def the_run(engine: Engine) -> RunView:
    await engine.submit(alert("l1"))
    await engine.wait_idle()
    (run,) = engine.journal.list_runs()
    return run


async def shown(engine: Engine, web_config: RemediatorConfig) -> tuple[dict[str, Any], str]:
    """The run as `/api/remediations` and the page `/` show it."""
    app = make_app(FakeEngine(), engine.journal, web_config, CollectorRegistry(), None)
    async with TestClient(TestServer(app)) as client:
        api = await (await client.get("/api/remediations", headers=bearer())).json()
        page = await (await client.get("/", headers=bearer())).text()
    (run,) = api["runs"]
    return run, page


def log_text(run: RunView) -> str:
    return " ".join(" ".join(format_run(run, 100)).split())


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory()


async def test_a_lock_another_holder_has_ends_the_run_locked_naming_head_holder_and_the_way(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], web_config: RemediatorConfig
) -> None:
    engine = make_engine(
        make_config(tmp_path, "succeeding", lock_wait="0s"), inventory, tmp_path=tmp_path
    )
    engines.append(engine)
    hold_lock(inventory)
    run = await the_run(engine)
    assert run.outcome == "locked" and run.steps == []
    assert run.detail.startswith(
        "the model lock on ai001: locked by serve (run r1, pid"
        f" {os.getpid()} on node ai001, since 00:00:00Z)"
    )
    assert run.next_action is not None
    assert run.next_action.startswith(
        f"nothing was done to {MODEL}: wait for that holder to let go"
    )
    assert "the next run breaks a dead holder's lock" in run.next_action
    assert run.next_action.endswith(f"or run `mlx-medic remediate {MODEL}`")

    api, page = await shown(engine, web_config)
    assert (api["outcome"], api["detail"], api["next_action"]) == (
        "locked",
        run.detail,
        run.next_action,
    )
    assert '<span class="badge muted">locked</span>' in page
    assert "the model lock on ai001: locked by serve (run r1" in page
    assert f"nothing was done to {MODEL}: wait for that holder" in page
    said = log_text(run)
    assert " locked " in said and f"why: {run.detail}" in said
    assert f"NEXT: {run.next_action}" in said


async def test_a_lock_helper_that_errs_ends_the_run_failed_not_locked_with_its_error(
    tmp_path: Path, inventory: Inventory, engines: list[Engine], web_config: RemediatorConfig
) -> None:
    """No holder was found: not `locked`; nothing was done: no budget spent, no circuit."""
    engine = make_engine(
        make_config(tmp_path, "succeeding", lock_wait="0s"),
        inventory,
        transport=LockHelperErrs(),
    )
    engines.append(engine)
    run = await the_run(engine)
    assert run.outcome == "failed" and run.steps == []
    assert run.detail.startswith("the lock helper failed on ai001: ") and DENIED in run.detail
    assert run.next_action is not None
    assert run.next_action.startswith(
        f"nothing was done to {MODEL}, no holder was found: fix what the lock helper says on"
        " ai001 (`"
    )
    assert f" node lock {MODEL} show " in run.next_action
    assert run.next_action.endswith(f"or run `mlx-medic remediate {MODEL}`")
    assert not engine.journal.list_events(kind="escalation") and not engine.journal.controls()
    assert not engine.journal.counted_run_times(MODEL, 0.0)

    api, page = await shown(engine, web_config)
    assert (api["outcome"], api["detail"], api["next_action"]) == (
        "failed",
        run.detail,
        run.next_action,
    )
    assert '<span class="badge bad">failed</span>' in page and "locked" not in page
    assert "the lock helper failed on ai001" in page
    said = log_text(run)
    assert " failed " in said and "NEXT: nothing was done" in said and " locked " not in said


async def test_the_lock_lease_is_the_configs_and_one_too_short_to_renew_is_refused(
    tmp_path: Path, inventory: Inventory, engines: list[Engine]
) -> None:
    """A replica off the nodes is judged by its lease alone: `lock_lease` sets it (a dead
    replica's lock is broken after it); under 3 s it could not be renewed in time."""
    engine = make_engine(make_config(tmp_path, lock_lease="20s"), inventory, tmp_path=tmp_path)
    engines.append(engine)
    assert engine.locks.lease == 20.0
    with pytest.raises(ValueError, match="lock_lease"):
        make_config(tmp_path, lock_lease="1s")
