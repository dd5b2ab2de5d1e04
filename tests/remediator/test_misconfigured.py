"""A node whose mlx-medic is deployed wrong for a run is named, not guessed at: found while
the run re-checks, takes the model lock or asks its read-only preflight, the run ends
`misconfigured` (never `locked`): nothing done to the service, no budget spent, no circuit
opened, a warning, mlx_medic_node_misconfigured_total{model,node,kind} (which
MLXMedicMisconfigured alerts on), and the fix as the next action, in red on the page.
Found by a step after one that acted, the run escalates with the fix as its next action.
The lock's helper runs for real here (LocalTransport); the steps' answer from a script."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import REMEDIATOR, HelperMisconfigured
from mlx_medic.node.misconfiguration import (
    Misconfiguration,
    MisconfigurationKind,
    version_mismatch,
)
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import RunView
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.oncall_page import render_page
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import (
    MODEL,
    Health,
    alert,
    inventory_text,
    make_config,
    make_engine,
    make_inventory,
)
from tests.remediator.fake_helpers import FakeHelpers

REFUSED = Misconfiguration(
    "ai002",
    MisconfigurationKind.REFUSED,
    "ai002's forced command refused the call: mlx-medic forced command: refused ...",
    None,
    "render and install authorized-keys for ai002 again (mlx-medic render authorized-keys):"
    " its forced command does not allow this call",
)


async def one_run(
    tmp_path: Path,
    engines: list[Engine],
    inventory: Inventory,
    answers: dict[tuple[str, str], Any] | None = None,
    health: Health | None = None,
) -> tuple[Engine, FakeHelpers, RunView, CollectorRegistry]:
    registry = CollectorRegistry()
    engine = make_engine(
        make_config(tmp_path, lock_wait="60s"),
        inventory,
        transport=LocalTransport(),
        health=health or Health(up=False),
        registry=registry,
    )
    engines.append(engine)
    helpers = FakeHelpers(inventory, answers)
    engine.helpers = helpers
    await engine.submit(alert("m1"))
    await engine.wait_idle(30)
    (run,) = engine.journal.list_runs()
    return engine, helpers, run, registry


def misconfigured_count(registry: CollectorRegistry, node: str, kind: str) -> float | None:
    return registry.get_sample_value(
        "mlx_medic_node_misconfigured_total", {"model": MODEL, "node": node, "kind": kind}
    )


def nothing_was_done(engine: Engine, helpers: FakeHelpers, run: RunView) -> None:
    assert helpers.of("service") == [] and helpers.of("sweep") == []
    assert not run.counted  # no restart budget spent
    assert not engine.journal.list_events(kind="escalation")  # no circuit: it acts once fixed


async def test_a_head_whose_lock_helper_cannot_read_its_inventory_ends_misconfigured(
    tmp_path: Path, engines: list[Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: the nodes' medic_config is not on the node, so the head's `node
    lock` cannot read it (exit 2). Not `locked`, and no wait for a holder."""
    absent = tmp_path / "etc" / "inventory.yaml"
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory_text(tmp_path / "state", medic_config=absent))
    with caplog.at_level(logging.INFO, logger="mlx_medic.remediator.engine"):
        engine, helpers, run, registry = await one_run(tmp_path, engines, load_inventory(path))
    assert run.outcome == "misconfigured" and run.steps == []
    fix = f"put the inventory at {absent} on ai001, or set nodes.ai001.medic_config to where it is"
    assert run.detail == (
        f"taking the model lock: mlx-medic on ai001 cannot read its inventory {absent}:"
        f" No such file or directory; fix: {fix}"
    )
    assert run.next_action == (
        f"nothing was done to {MODEL}: {fix}; then the next notification of the alert starts"
        f" a new run, or run `mlx-medic remediate {MODEL}`"
    )
    nothing_was_done(engine, helpers, run)
    assert misconfigured_count(registry, "ai001", "config-unreadable") == 1
    assert (
        registry.get_sample_value(
            "mlx_medic_remediations_total", {"model": MODEL, "outcome": "misconfigured"}
        )
        == 1
    )
    ended = [
        r for r in caplog.records if r.getMessage() == f"run 1 of {MODEL} ended: misconfigured"
    ]
    assert [r.levelno for r in ended] == [logging.WARNING]


async def test_a_node_of_another_version_in_the_preflight_ends_misconfigured_before_any_stop(
    tmp_path: Path, engines: list[Engine]
) -> None:
    older = version_mismatch("ai003", "0.0.1", REMEDIATOR)
    answers = {("ai003", "facts"): HelperMisconfigured("facts", older)}
    engine, helpers, run, registry = await one_run(tmp_path, engines, make_inventory(), answers)
    assert run.outcome == "misconfigured"
    assert [(s.name, s.outcome) for s in run.steps] == [("preflight", "failed")]
    assert run.detail.startswith("step preflight on ai001, ai002, ai003, ai004: ai003 runs")
    assert "ai003 runs mlx-medic 0.0.1, this remediator" in run.detail
    assert run.next_action is not None
    assert run.next_action.startswith(f"nothing was done to {MODEL}: upgrade mlx-medic on ai003 to")
    assert "(nodes first, then the remediator)" in run.next_action
    nothing_was_done(engine, helpers, run)
    assert misconfigured_count(registry, "ai003", "version-mismatch") == 1


async def test_a_recheck_whose_head_is_misconfigured_ends_misconfigured(
    tmp_path: Path, engines: list[Engine]
) -> None:
    missing = Misconfiguration(
        "ai001",
        MisconfigurationKind.HELPER_MISSING,
        "mlx-medic on ai001 is not found at /opt/mlx-medic/bin/mlx-medic (...)",
        "/opt/mlx-medic/bin/mlx-medic",
        "install mlx-medic on ai001 at /opt/mlx-medic/bin/mlx-medic (nodes.ai001.medic_command)",
    )
    health = Health(verdicts=[HealthVerdict.misconfigured(missing, "could not probe on ai001")])
    engine, helpers, run, registry = await one_run(
        tmp_path, engines, make_inventory(), health=health
    )
    assert run.outcome == "misconfigured" and run.steps == []
    assert run.detail == f"re-check: {missing}"
    nothing_was_done(engine, helpers, run)
    assert misconfigured_count(registry, "ai001", "helper-missing") == 1


async def test_a_step_that_acts_and_is_refused_escalates_with_the_fix_as_next_action(
    tmp_path: Path, engines: list[Engine]
) -> None:
    """The service was stopped by then: a person must look, so the circuit opens."""
    answers = {("ai002", "sweep"): HelperMisconfigured("sweep", REFUSED)}
    engine, helpers, run, registry = await one_run(tmp_path, engines, make_inventory(), answers)
    assert run.outcome == "escalated"
    assert run.next_action is not None and run.next_action.startswith(REFUSED.fix)
    assert helpers.of("service") != [] and run.counted
    assert engine.journal.list_events(kind="escalation")  # its circuit is open
    assert misconfigured_count(registry, "ai002", "refused") == 1


def test_the_page_shows_a_misconfigured_run_in_red_with_its_fix_as_the_next_action() -> None:
    run = {
        "id": 7,
        "model": MODEL,
        "outcome": "misconfigured",
        "detail": f"taking the model lock: {REFUSED}",
        "next_action": f"nothing was done to {MODEL}: {REFUSED.fix}",
        "steps": [],
    }
    page = render_page([run], now=datetime.now(UTC))
    assert '<article class="run bad"' in page
    assert (
        '<p class="next"><strong>Next action for on-call</strong>nothing was done to'
        f" {MODEL}: render and install authorized-keys for ai002 again"
    ) in page
