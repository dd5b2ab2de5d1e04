"""A node that does not answer over SSH is `unreachable`, never `locked`: the run ends
so, at warning, counted in mlx_medic_node_unreachable_total{model,node} (which
MLXMedicNodeUnreachable alerts on), shown in red on the page with what to do; a failed
start-up lock check says so on stderr too. Real SSH against an address where nothing
listens, and on the testbed a head whose sshd is frozen."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.config import FLAG_FOUND_BY, ConfigSource
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal, RunView, owner_tag
from mlx_medic.transport import SshTransport
from testbed.freezer import frozen
from tests.remediator.conftest import (
    SILENT_PORT,
    Stack,
    basic,
    bearer,
    events_of,
    http,
    make_alert,
    make_payload,
    post_alerts,
    runs_of,
    silent_inventory,
    start_service,
    wait_until,
    write_config,
)
from tests.remediator.engine_fakes import Health, alert, dead_pid, make_config, make_engine


@pytest.fixture
def silent(tmp_path: Path, ssh_transports: list[SshTransport]) -> tuple[Inventory, SshTransport]:
    """The silent inventory and a real SSH transport to it."""
    inventory = silent_inventory(tmp_path)
    transport = SshTransport(inventory)
    ssh_transports.append(transport)
    return inventory, transport


async def one_run(engine: Engine) -> RunView:
    try:
        assert await engine.submit(alert("u1", "m1")) == Disposition.STARTED
        await engine.wait_idle(30)
    finally:
        await engine.close()
    (run,) = engine.journal.list_runs()
    return run


def unreachable_count(registry: CollectorRegistry, node: str = "ai001") -> float | None:
    return registry.get_sample_value(
        "mlx_medic_node_unreachable_total", {"model": "m1", "node": node}
    )


async def test_a_head_that_does_not_answer_while_taking_the_lock_ends_the_run_unreachable(
    tmp_path: Path,
    silent: tuple[Inventory, SshTransport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory, transport = silent
    registry = CollectorRegistry()
    engine = make_engine(
        make_config(tmp_path, lock_wait="60s"),
        inventory,
        transport=transport,
        health=Health(up=False),
        registry=registry,
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.INFO, logger="mlx_medic.remediator.engine"):
        run = await one_run(engine)
    assert loop.time() - started < 30  # not the lock wait: that is for a live holder
    assert run.outcome == "unreachable" and run.steps == []
    assert run.detail.startswith(
        "ai001 did not answer over SSH (taking the model lock: cannot reach the lock on ai001:"
        f" cannot reach ai001 (medic@127.0.0.1:{SILENT_PORT})"
    )
    assert run.next_action is not None
    assert run.next_action.startswith(
        "nothing was done to m1: check that ai001 is up and its mlx-medic answers over SSH as"
        f" the remediator connects (`ssh -F none -o UserKnownHostsFile={tmp_path}/known_hosts"
        " -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=3"
        f" -p {SILENT_PORT} medic@127.0.0.1 mlx-medic node facts --inventory"
    )
    assert "--node ai001 --json` as the remediator's user: a JSON document" in run.next_action
    assert run.next_action.endswith("or run `mlx-medic remediate m1`")  # no config file
    assert unreachable_count(registry) == 1
    assert (
        registry.get_sample_value(
            "mlx_medic_remediations_total", {"model": "m1", "outcome": "unreachable"}
        )
        == 1
    )
    ended = [r for r in caplog.records if r.getMessage() == "run 1 of m1 ended: unreachable"]
    assert [r.levelno for r in ended] == [logging.WARNING]
    assert not engine.journal.list_events(kind="escalation")  # no circuit: it may act again


async def test_the_next_action_names_the_config_file_the_service_runs_with(
    tmp_path: Path, silent: tuple[Inventory, SshTransport]
) -> None:
    """Typed as printed, `remediate` reaches the journal the service writes."""
    inventory, transport = silent
    given = ConfigSource(tmp_path / "my remediator.yml", FLAG_FOUND_BY)
    engine = make_engine(make_config(tmp_path), inventory, transport=transport, config_source=given)
    run = await one_run(engine)
    assert run.outcome == "unreachable" and run.next_action is not None
    assert run.next_action.endswith(
        f"or run `mlx-medic remediate m1 --config.file '{tmp_path}/my remediator.yml'`"
    )


async def test_a_head_that_does_not_answer_the_recheck_ends_the_run_unreachable(
    tmp_path: Path,
    silent: tuple[Inventory, SshTransport],
) -> None:
    """m1 listens on loopback: the re-check probes it on its head over SSH."""
    inventory, transport = silent
    registry = CollectorRegistry()
    config = make_config(tmp_path)
    engine = Engine(
        config,
        inventory,
        Journal(config.journal),
        transport,
        registry=registry,
        hostname="replica-a",
    )  # the real re-check
    run = await one_run(engine)
    assert run.outcome == "unreachable"
    assert run.detail.startswith(
        "ai001 did not answer over SSH (re-check: could not confirm m1 is down: could not"
        " probe on ai001: cannot reach ai001"
    )
    assert unreachable_count(registry) == 1


async def test_a_failed_start_up_lock_check_is_a_warning_counted_and_journaled(
    tmp_path: Path,
    silent: tuple[Inventory, SshTransport],
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory, transport = silent
    config = make_config(tmp_path)
    journal = Journal(config.journal)
    crashed = journal.create_run(
        model="m1",
        playbook="recover",
        trigger_kind="alert",
        owner=owner_tag("replica-a", dead_pid()),
        now=1.0,
    )
    registry = CollectorRegistry()
    engine = make_engine(config, inventory, journal=journal, transport=transport, registry=registry)
    with caplog.at_level(logging.WARNING, logger="mlx_medic.remediator.engine"):
        await engine.start()
    await engine.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith(
            "start-up lock check failed: could not check the lock of"
            f" interrupted run {crashed} on ai001"
        )
        for m in warned
    ), warned
    assert unreachable_count(registry) == 1
    (event,) = journal.list_events(kind="lock_check_failed")
    assert "cannot reach ai001" in event.detail


def test_the_service_says_a_failed_start_up_lock_check_on_stderr(
    tmp_path: Path,
    services: list[Any],
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(silent_inventory(tmp_path).model_dump(mode="json")))
    journal_path = tmp_path / "journal.sqlite"
    journal = Journal(journal_path)
    journal.create_run(
        model="m1",
        playbook="recover",
        trigger_kind="alert",
        owner=owner_tag(socket.gethostname(), dead_pid()),
        now=1.0,
    )
    journal.close()
    config = write_config(
        tmp_path / "remediator.yml",
        {"inventory": str(inventory), "journal": str(journal_path), "insecure_no_auth": True},
    )
    service = start_service(config, journal_path, tmp_path)
    services.append(service)
    line = wait_until(
        lambda: [
            entry
            for entry in service.log_lines()
            if entry.get("msg", "").startswith("start-up lock check failed")
        ],
        what="the start-up warning on stderr",
    )[0]
    assert line["level"] == "warning" and line["node"] == "ai001"
    assert "cannot reach ai001" in line["msg"]


# --- the real thing: a head whose sshd is frozen ------------------------------------------


@pytest.mark.testbed
@pytest.mark.least_privilege
def test_a_head_whose_sshd_is_frozen_is_unreachable_warned_counted_and_red_on_the_page(
    stack: Stack,
) -> None:
    data = yaml.safe_load(stack.inventory.read_text())
    data["ssh"]["connect_timeout"] = "3s"
    stack.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    # The model listens on loopback where nothing is: probed from here it is down, so
    # the run goes on to take the lock on the head.
    service = stack.start(config=stack.config(probe_from="remediator"))
    head = stack.cluster.head
    firing = make_payload(make_alert("m1", fingerprint="fz"))
    with frozen([head.init_pid], f"sshd-{uuid.uuid4().hex[:10]}"):
        status, body = post_alerts(service, firing)
        assert (status, body["alerts"][0]["disposition"]) == (202, "started")
        run = wait_until(
            lambda: [r for r in runs_of(stack, "m1") if r["outcome"] not in ("queued", "running")],
            timeout=60,
            what="the run to end",
        )[0]
    assert run["outcome"] == "unreachable"
    assert run["detail"].startswith("ai001 did not answer over SSH (taking the model lock:")
    # the hint connects as the remediator does: typed once the node is back, it answers
    (hint,) = re.findall(r"`(ssh [^`]+)`", run["next_action"])
    assert f"-p {head.ssh_port} " in hint and f"@{head.address} " in hint
    assert " node facts " in hint
    typed = subprocess.run(shlex.split(hint), capture_output=True, text=True, timeout=30)
    assert typed.returncode == 0, typed.stderr
    ended = [
        line
        for line in service.log_lines()
        if line.get("msg") == f"run {run['id']} of m1 ended: unreachable"
    ]
    assert [line["level"] for line in ended] == ["warning"]
    _, metrics = http("GET", service.url + "/metrics", headers=bearer())
    assert 'mlx_medic_node_unreachable_total{model="m1",node="ai001"} 1.0' in metrics
    assert 'mlx_medic_remediations_total{model="m1",outcome="unreachable"} 1.0' in metrics
    _, page = http("GET", service.url + "/", headers=basic())
    assert '<span class="badge bad">unreachable</span>' in page
    assert '<span class="badge muted">locked</span>' not in page
    assert "Next action for on-call</strong>nothing was done to m1: check that ai001" in page
    assert not events_of(stack, kind="escalation")
    # sshd answers again: the same firing, sent again, acts (the run did nothing).
    assert post_alerts(service, firing)[1]["alerts"][0]["disposition"] == "started"
    wait_until(
        lambda: (
            len(runs_of(stack, "m1")) == 2
            and runs_of(stack, "m1")[0]["outcome"] not in ("queued", "running", "unreachable")
        ),
        timeout=60,
        what="the second run",
    )
