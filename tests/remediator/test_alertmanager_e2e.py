"""A real Alertmanager (Debian's prometheus-alertmanager) delivers to the real remediator,
authenticating with a bearer token it reads from a file: the firing starts a run that shows
in the journal, on the on-call page and in `mlx-medic log`; the resolution shows too."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.remediator.conftest import (
    Alertmanager,
    Stack,
    alertmanager_config,
    am_time,
    basic,
    events_of,
    http,
    mlx_medic,
    runs_of,
    start_alertmanager,
    wait_until,
)


def test_alertmanager_delivers_a_firing_and_its_resolution_to_the_remediator(
    stack: Stack,
    tmp_path: Path,
    managers: list[Alertmanager],
) -> None:
    service = stack.start("--dry-run")
    manager = start_alertmanager(
        tmp_path / "am", alertmanager_config(service.url + "/alerts", stack.token_file)
    )
    managers.append(manager)
    starts = datetime.now(UTC) - timedelta(seconds=5)
    labels = ["alertname=LLMModelDown", "model=m1", "severity=critical"]
    manager.amtool(
        "alert",
        "add",
        *labels,
        f"--start={am_time(starts)}",
        "--annotation=summary=m1 answers no health probe",
    )

    run = wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["outcome"] == "planned"],
        timeout=60,
        what="Alertmanager's firing to become a planned run",
    )[0]
    assert run["alertname"] == "LLMModelDown" and run["labels"]["severity"] == "critical"
    assert run["dry_run"] and run["steps"]
    assert all(step["outcome"] == "planned" for step in run["steps"])

    # Resolve it: the same alert with an end time in the past.
    manager.amtool(
        "alert",
        "add",
        *labels,
        f"--start={am_time(starts)}",
        f"--end={am_time(datetime.now(UTC) - timedelta(seconds=1))}",
    )
    resolved = wait_until(
        lambda: events_of(stack, kind="resolved", model="m1"),
        timeout=60,
        what="Alertmanager's resolved notification",
    )
    assert resolved[0]["fingerprint"] == run["fingerprint"]
    assert len(runs_of(stack, "m1")) == 1

    # Every delivery was authenticated (bearer from the file) and accepted.
    deliveries = [
        line
        for line in service.log_lines()
        if line.get("msg") == "request" and line.get("path") == "/alerts"
    ]
    assert deliveries and {d["status"] for d in deliveries} == {202}
    assert "started" in deliveries[0]["dispositions"]

    # On the page ...
    status, page = http("GET", service.url + "/", headers=basic())
    assert status == 200
    assert "m1" in page and "planned" in page and run["fingerprint"] in page
    for step in run["steps"]:
        assert step["name"] in page
    assert "resolved" in page

    # ... and in `mlx-medic log`, as a table and as JSON.
    config = ["--config.file", str(service.config_file)]
    table = mlx_medic("log", "--model", "m1", *config).stdout
    assert "m1" in table and "planned" in table
    decisions = table.split("RECENT DECISIONS", 1)[1]
    assert "resolved" in decisions and run["fingerprint"][:18] in decisions
    logged = json.loads(mlx_medic("log", "--model", "m1", "--json", *config).stdout)
    assert [entry["id"] for entry in logged["runs"]] == [run["id"]]
    assert {"resolved", "started"} <= {event["kind"] for event in logged["events"]}


def test_after_an_escalation_and_resume_alertmanagers_next_notification_of_the_same_firing_acts(
    stack: Stack,
    tmp_path: Path,
    managers: list[Alertmanager],
) -> None:
    """Dedupe stops only repeats of a firing whose run is in flight or succeeded: an
    escalated run did not fix the model, so once on-call resumes, Alertmanager's next
    re-notification of the very same firing (fingerprint and startsAt) starts a run."""
    service = stack.start()  # not a dry run: without the node helpers, recover escalates
    config = alertmanager_config(service.url + "/alerts", stack.token_file)
    config["route"]["repeat_interval"] = "4s"  # re-notify an unchanged group this often
    manager = start_alertmanager(tmp_path / "am", config)
    managers.append(manager)
    manager.amtool(
        "alert",
        "add",
        "alertname=LLMModelDown",
        "model=m1",
        "severity=critical",
        f"--start={am_time(datetime.now(UTC) - timedelta(seconds=5))}",
    )

    first = wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["outcome"] == "escalated"],
        timeout=60,
        what="the first run to escalate",
    )[0]
    # While the circuit is open, Alertmanager's repeats start nothing.
    wait_until(
        lambda: events_of(stack, kind="circuit_open", model="m1"),
        timeout=60,
        what="a re-notification while the circuit is open",
    )
    assert len(runs_of(stack, "m1")) == 1

    resumed = mlx_medic("resume", "m1", "--config.file", str(service.config_file), check=False)
    assert resumed.returncode == 0, resumed.stderr
    second = wait_until(
        lambda: [r for r in runs_of(stack, "m1") if r["id"] != first["id"]],
        timeout=60,
        what="a new run from the same firing after resume",
    )[0]
    assert (second["fingerprint"], second["starts_at"]) == (
        first["fingerprint"],
        first["starts_at"],
    )
    assert second["trigger_kind"] == "alert"

    def deliveries() -> list[dict[str, Any]]:
        return [
            line
            for line in service.log_lines()
            if line.get("msg") == "request" and line.get("path") == "/alerts"
        ]

    # The request's line is written once its answer is sent, after the run it started is
    # journaled: wait for it rather than race it.
    started = wait_until(
        lambda: [d["dispositions"] for d in deliveries() if "started" in d["dispositions"]][1:],
        timeout=10,
        what="the second delivery's request line",
    )
    assert started == [["started"]]
    assert [d["dispositions"] for d in deliveries() if "started" in d["dispositions"]] == [
        ["started"],
        ["started"],
    ]
    assert not [d for d in deliveries() if "duplicate" in d["dispositions"]]
