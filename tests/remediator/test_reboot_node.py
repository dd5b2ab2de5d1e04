"""`reboot-node`, the guarded reboot (issue 29 part 3), run by the engine for
MLXUnkillableSurvivors with its node helpers answering from a script: the guards' view
gathered from the nodes and the journal, each refusal ended with the guard named and
nothing acted, and the allowed run's order (pause, stop, sweep, `node reboot`, a new boot
id, resume, start, verify). The helper's argv and the forced command that accepts it. On
real parts: tests/remediator/test_guarded_reboot_testbed.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.forced_command import Allowed, Refused, checked
from mlx_medic.node.reboot_cli import reboot_argv
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import RunView
from mlx_medic.remediator.model_health import HealthVerdict
from mlx_medic.remediator.playbooks.reboot_node import REBOOT_NODE, RebootNodePlaybook
from mlx_medic.transport import LocalTransport
from tests.remediator.engine_fakes import MEDIC, MODEL, Health, alert, inventory_text, make_config
from tests.remediator.engine_fakes import make_engine as _make_engine
from tests.remediator.fake_helpers import DEFAULTS, Answer, FakeHelpers, unreachable

NODE = "ai002"  # MODEL's only, with reboot.allowed; ai003 keeps the default (off)
DOWN, UP = HealthVerdict.down("connection refused"), HealthVerdict.up("completed a request")
SURVIVOR = {"pid": 4242, "model": MODEL, "backend": "jaccl", "devices": ["rdma_en2"], "domains": 1}


def reboot_inventory(
    tmp_path: Path, command: list[str] | None = None, boot_timeout: str = "15m"
) -> Inventory:
    path = tmp_path / "inventory.yaml"
    data = yaml.safe_load(inventory_text(tmp_path / "state", medic_config=path, backoff=0))
    data["models"][MODEL]["policy"]["start_timeout"] = "1s"
    data["nodes"][NODE]["reboot"] = {
        "allowed": True,
        "command": command or ["/sbin/shutdown", "-r", "now"],
        "boot_timeout": boot_timeout,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_inventory(path)


def facts(boot: str, *, booted_ago: float = 86400.0, survivors: bool = True) -> Answer:
    boot_part = {
        "id": boot,
        "booted_at": time.time() - booted_ago,
        "survivors": [SURVIVOR] if survivors else [],
    }
    return Answer({**DEFAULTS["facts"], "boot": boot_part})


@pytest.fixture
def engines():
    made: list[Engine] = []
    yield made


async def run_for(
    tmp_path: Path,
    health: Health,
    answers: dict[tuple[str, str], Any],
    *,
    node: str = NODE,
    before: Any = None,
    boot_timeout: str = "15m",
) -> tuple[Engine, FakeHelpers, Disposition, RunView | None]:
    inventory = reboot_inventory(tmp_path, boot_timeout=boot_timeout)
    config = make_config(
        tmp_path,
        lock_wait="5s",
        routing={"playbooks": {"MLXUnkillableSurvivors": REBOOT_NODE}},
    )
    engine = _make_engine(
        config,
        inventory,
        transport=LocalTransport(),
        health=health,
        playbooks={REBOOT_NODE: RebootNodePlaybook(poll_interval=0.01)},
    )
    helpers = FakeHelpers(inventory, answers)
    engine.helpers = helpers
    if before is not None:
        before(engine)
    try:
        said = await engine.submit(
            alert(
                "s1",
                model=None,
                alertname="MLXUnkillableSurvivors",
                labels={"node": node, "models": MODEL},
            )
        )
        await engine.wait_idle(30)
        runs = engine.journal.list_runs()
        return engine, helpers, said, runs[0] if runs else None
    finally:
        await engine.close()


def acted(helpers: FakeHelpers) -> list[str]:
    """The helpers called that change something."""
    return [h for _, h, _ in helpers.calls if h in ("service", "sweep", "reboot", "clean")]


async def test_off_by_default_the_alert_is_declined_naming_the_off_guard(tmp_path: Path):
    engine, helpers, said, run = await run_for(tmp_path, Health(), {}, node="ai003")
    assert said is Disposition.UNROUTED and run is None and helpers.calls == []
    (event,) = [e for e in engine.journal.list_events() if e.kind == "unrouted"]
    assert event.detail == ("reboot refused by the off guard: nodes.ai003.reboot.allowed is false")


async def test_an_alert_naming_no_inventory_node_starts_nothing(tmp_path: Path):
    engine, helpers, said, run = await run_for(tmp_path, Health(), {}, node="ai042")
    assert said is Disposition.UNKNOWN_MODEL and run is None and helpers.calls == []
    (event,) = [e for e in engine.journal.list_events() if e.kind == "unknown_model"]
    assert event.detail == "label node='ai042' names no node in the inventory"


async def refused(tmp_path: Path, guard: str, **kwargs: Any) -> RunView:
    _, helpers, said, run = await run_for(tmp_path, **kwargs)
    assert said is Disposition.STARTED and run is not None
    assert run.outcome == "skipped", run
    assert run.detail.startswith(f"reboot refused by the {guard} guard: "), run.detail
    assert acted(helpers) == [] and run.steps == []
    return run


async def test_a_persons_pause_refuses_naming_the_paused_guard(tmp_path: Path):
    def pause(engine: Engine) -> None:
        engine.journal.set_pause(MODEL, reason="looking", by_whom="alice", now=time.time())

    run = await refused(
        tmp_path,
        "paused",
        health=Health(up=False),
        answers={(NODE, "facts"): facts("b1")},
        before=pause,
    )
    assert "alice" not in run.detail and MODEL in run.detail


async def test_another_node_being_rebooted_refuses_one_node_at_a_time(tmp_path: Path):
    def another(engine: Engine) -> None:
        engine.journal.create_alert_run(
            model="qwq-32b-8bit",
            playbook=REBOOT_NODE,
            owner="replica-b",
            now=time.time(),
            alertname="MLXUnkillableSurvivors",
            fingerprint="other",
            starts_at="2026-12-04T00:00:00+00:00",
            labels={"node": "ai005"},
            links={},
            dry_run=False,
        )

    run = await refused(
        tmp_path,
        "another-rebooting",
        health=Health(up=False),
        answers={(NODE, "facts"): facts("b1")},
        before=another,
    )
    assert "ai005 is being rebooted" in run.detail


async def test_a_node_booted_recently_is_refused(tmp_path: Path):
    await refused(
        tmp_path,
        "booted-recently",
        health=Health(up=False),
        answers={(NODE, "facts"): facts("b1", booted_ago=60)},
    )


async def test_the_last_healthy_node_of_a_serving_model_is_refused(tmp_path: Path):
    silent = {(n, "facts"): unreachable(n, "facts") for n in ("ai001", "ai003", "ai004")}
    await refused(
        tmp_path,
        "last-healthy-node",
        health=Health(up=True),
        answers={(NODE, "facts"): facts("b1"), **silent},
    )


async def test_no_survivor_holding_domains_is_no_need(tmp_path: Path):
    await refused(
        tmp_path,
        "no-need",
        health=Health(up=False),
        answers={(NODE, "facts"): facts("b1", survivors=False)},
    )


async def test_allowed_it_drains_reboots_waits_for_the_new_boot_and_undrains(tmp_path: Path):
    answers = {(NODE, "facts"): [facts("b1"), facts("b1"), facts("b2")]}
    engine, helpers, said, run = await run_for(tmp_path, Health(verdicts=[DOWN], up=True), answers)
    assert said is Disposition.STARTED and run is not None
    assert run.outcome == "succeeded", (run.detail, [(s.name, s.detail) for s in run.steps])
    assert [s.name for s in run.steps] == [
        "pause-models",
        "stop-service",
        "sweep",
        "reboot-node",
        "resume-models",
        "stop-service",
        "sweep",
        "clean-tmp",
        "start-service",
        "verify",
    ]
    assert "every guard holds" in (run.recheck or "")
    reboot_step = run.steps[3]
    assert reboot_step.command == ["sudo", "-n", "/sbin/shutdown", "-r", "now"]
    assert reboot_step.detail == f"{NODE} rebooted: boot b1 -> b2"
    done = acted(helpers)
    assert done.index("reboot") > done.index("sweep") and done[-1] == "service"
    assert helpers.of("reboot") == [(NODE, ())]
    events = {e.kind: e.detail for e in engine.journal.list_events()}
    assert events["reboot"].startswith(f"rebooting {NODE} (boot id b1) by remediator run")
    assert "paused" in events and "resumed" in events
    assert engine.journal.controls() == []  # the run's pause is cleared


async def test_a_reboot_without_a_new_boot_id_escalates_and_keeps_the_pauses(tmp_path: Path):
    engine, _, _, run = await run_for(
        tmp_path,
        Health(verdicts=[DOWN], up=True),
        {(NODE, "facts"): facts("b1")},
        boot_timeout="1s",
    )
    assert run is not None and run.outcome == "escalated"
    assert "did not answer with a new boot id" in run.detail
    assert [c.model for c in engine.journal.controls()] == [MODEL]


# --- the helper and the forced command --------------------------------------------------


def test_the_helpers_argv_is_the_inventorys_command_through_sudo_n_never_a_shell():
    command = ["/sbin/shutdown", "-r", "now"]
    assert reboot_argv(command, as_root=False) == ["sudo", "-n", *command]
    assert reboot_argv(command, as_root=True) == command


def node_reboot(inventory: Inventory, node: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [MEDIC, "node", "reboot", "--inventory", str(inventory.node(node).medic_config)]
    return subprocess.run(
        [*argv, "--node", node, "--json", *extra], capture_output=True, text=True, check=False
    )


def test_the_helper_runs_exactly_the_command_and_refuses_a_node_without_reboot_allowed(
    tmp_path: Path,
):
    marker = tmp_path / "ran"
    inventory = reboot_inventory(tmp_path, ["/usr/bin/touch", str(marker)])
    done = node_reboot(inventory, NODE)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    assert document["argv"] == [*prefix, "/usr/bin/touch", str(marker)]
    assert marker.exists() == (os.geteuid() == 0 or document["exit_status"] == 0)
    off = node_reboot(inventory, "ai003")
    assert off.returncode == 2 and "reboot.allowed is false" in off.stderr


def test_the_forced_command_accepts_the_remediators_reboot_and_nothing_more(tmp_path: Path):
    inventory = reboot_inventory(tmp_path)
    config = inventory.node(NODE).medic_config
    allowed = Allowed(inventory, config, NODE, key="remediator")
    sent = f"{MEDIC} node reboot --inventory {config} --node {NODE} --json --time-limit 30"
    argv, grant = checked(sent, allowed)
    assert argv[:2] == ["node", "reboot"] and grant.helper == "reboot"
    for extra in ("--dry-run", "; /bin/sh"):
        with pytest.raises(Refused):
            checked(f"{sent} {shlex.quote(extra) if ';' in extra else extra}", allowed)
    with pytest.raises(Refused, match=r"never sends|not allowed"):
        checked(sent, Allowed(inventory, config, NODE, key="serve"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
