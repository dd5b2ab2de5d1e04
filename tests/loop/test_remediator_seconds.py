"""The remediator's own time in a run (issue 22's goal: webhook arrival to the service's
start command, configured grace periods excluded), read from the journal as the loop and
bench/whole_loop report it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.loop_scenarios import remediator_seconds


def step(name: str, started: float, ended: float, *documents: dict[str, Any]) -> dict[str, Any]:
    output = "\n".join(
        json.dumps({"node": f"ai00{i}", "document": d}) for i, d in enumerate(documents, 1)
    )
    return {"name": name, "started_at": started, "ended_at": ended, "output": output}


def test_recover_counts_from_queued_to_the_start_command_less_the_stop_and_sigterm_graces():
    run = {
        "queued_at": 100.0,
        "steps": [
            step("preflight", 100.1, 100.4),
            step("stop-service", 100.4, 105.6, {"manager_seconds": 5.0}),
            # two nodes swept at once: the longer grace is the one waited
            step("sweep", 105.6, 116.0, {"grace_waited": 10.0}, {"grace_waited": 4.0}),
            step("clean-tmp", 116.0, 116.3),
            step("start-service", 116.3, 116.9),
            step("verify", 116.9, 130.0),
        ],
    }
    assert remediator_seconds(run) == pytest.approx(116.3 - 100.0 - 5.0 - 10.0)


def test_sweep_orphans_counts_to_the_end_of_its_last_sweep():
    run = {
        "queued_at": 50.0,
        "steps": [
            step("sweep-orphans", 50.2, 51.0, {"grace_waited": 0.0}),
            step("sweep-orphans", 51.0, 53.5, {"grace_waited": 2.0}),
            step("verify", 53.5, 53.6),
        ],
    }
    assert remediator_seconds(run) == pytest.approx(53.5 - 50.0 - 2.0)


def test_a_run_that_reached_no_start_and_no_sweep_has_no_such_time():
    run = {"queued_at": 10.0, "steps": [step("preflight", 10.1, 10.2)]}
    assert remediator_seconds(run) is None
    # a step's output that is not a helper document (an unreachable node) counts nothing
    unreachable = {
        "name": "stop-service",
        "started_at": 10.1,
        "ended_at": 12.0,
        "output": json.dumps({"node": "ai001", "error": "no route"}),
    }
    run = {"queued_at": 10.0, "steps": [unreachable, step("start-service", 12.0, 12.5)]}
    assert remediator_seconds(run) == 2.0
