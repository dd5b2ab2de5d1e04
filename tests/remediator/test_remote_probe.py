"""The re-check before acting probes a loopback listener where it listens: on the model's
head node, through the node helper `mlx-medic node probe MODEL` over SSH, unless the
remediator is told it runs on that head. From the remediator's own machine, 127.0.0.1 is
the wrong machine: "connection refused" there would act on a healthy model. Which node the
remediator is on is said (config `node`, or the node id file), never guessed from an
address."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.cli import helper_document
from mlx_medic.remediator.config import ConfigError, RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.model_health import (
    HealthVerdict,
    ModelState,
    probe_model_health,
    probes_on_head,
    remediator_node,
)
from mlx_medic.state.node_identity import write_node_id
from mlx_medic.transport import CommandResult, SshTransport, TransportError
from testbed import free_port, wait_listening
from tests.remediator.engine_fakes import alert

REPO = Path(__file__).resolve().parents[2]


def _two_node_inventory(
    host: str, head_ssh: str = "192.168.101.1", state_dir: Path | None = None
) -> Inventory:
    return parse_inventory(
        yaml.safe_dump(
            {
                **({"state_dir": str(state_dir)} if state_dir is not None else {}),
                "nodes": {"ai001": {"ssh": head_ssh}, "ai002": {"ssh": "192.168.101.2"}},
                "models": {
                    "m1": {
                        "model": "tiny",
                        "nodes": ["ai001", "ai002"],
                        "port": 8080,
                        "host": host,
                        "service": {"manager": "launchd", "label": "m1"},
                        "backends": {"ring": {"hostfile": "/etc/mlx-medic/m1.ring.json"}},
                    }
                },
            }
        )
    )


# --- which node is the remediator on? ------------------------------------------------


def test_the_remediator_is_on_the_node_its_config_names(tmp_path: Path) -> None:
    inventory = _two_node_inventory("127.0.0.1", state_dir=tmp_path)
    assert remediator_node("ai002", inventory) == "ai002"
    assert remediator_node(None, inventory) is None  # no name, no node id file: off-cluster


def test_without_a_configured_name_the_node_id_file_says_it(tmp_path: Path) -> None:
    inventory = _two_node_inventory("127.0.0.1", state_dir=tmp_path)
    write_node_id(tmp_path, "ai001")
    assert remediator_node(None, inventory) == "ai001"
    assert remediator_node("ai002", inventory) == "ai002"  # the config wins


def test_a_node_name_the_inventory_does_not_list_is_a_config_error_saying_where(
    tmp_path: Path,
) -> None:
    inventory = _two_node_inventory("127.0.0.1", state_dir=tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"node: 'ai009' is not a node of the inventory"
        r" \(nodes: ai001, ai002\)",
    ):
        remediator_node("ai009", inventory)
    write_node_id(tmp_path, "gpu7")
    with pytest.raises(ConfigError, match=f"{tmp_path}/node-id: 'gpu7' is not a node"):
        remediator_node(None, inventory)


def test_the_engine_takes_its_node_from_the_config(tmp_path: Path) -> None:
    inventory = _two_node_inventory("127.0.0.1", state_dir=tmp_path / "state")
    config = RemediatorConfig.model_validate(
        {"journal": str(tmp_path / "journal.sqlite"), "node": "ai001"}
    )
    engine = Engine(
        config,
        inventory,
        Journal(config.journal),
        ScriptedTransport(AssertionError("unused")),
        registry=CollectorRegistry(),
    )  # type: ignore[arg-type]
    assert engine.this_node == "ai001"
    with pytest.raises(ConfigError, match="'nope' is not a node"):
        Engine(
            config.model_copy(update={"node": "nope"}),
            inventory,
            Journal(config.journal),
            ScriptedTransport(AssertionError("unused")),  # type: ignore[arg-type]
            registry=CollectorRegistry(),
        )


@pytest.mark.parametrize(
    ("host", "head_ssh", "probe_from", "this_node", "on_head"),
    [
        ("127.0.0.1", "192.168.101.1", "auto", None, True),  # loopback on another machine
        ("::1", "192.168.101.1", "auto", None, True),
        ("localhost", "192.168.101.1", "auto", None, True),
        # a loopback SSH address alone never means "this machine" (testbed nodes are 127.0.0.N)
        ("127.0.0.1", "127.0.0.1", "auto", None, True),
        ("127.0.0.1", "127.0.0.2", "auto", "ai002", True),  # we are a node, not its head
        ("127.0.0.1", "127.0.0.2", "auto", "ai001", False),  # we are its head: probe here
        ("127.0.0.1", "192.168.101.1", "auto", "ai001", False),
        (
            "0.0.0.0",
            "192.168.101.1",
            "auto",
            None,
            False,
        ),  # wildcard: the head's address, from here
        ("192.168.101.1", "192.168.101.1", "auto", None, False),
        ("127.0.0.1", "192.168.101.1", "remediator", None, False),
        ("192.168.101.1", "192.168.101.1", "head", None, True),
        ("127.0.0.1", "127.0.0.1", "head", "ai001", True),
    ],
)
def test_where_the_recheck_probes_follows_the_listen_address_probe_from_and_our_node(
    host: str,
    head_ssh: str,
    probe_from: Any,
    this_node: str | None,
    on_head: bool,
) -> None:
    model = _two_node_inventory(host, head_ssh).model("m1")
    assert probes_on_head(model, probe_from, this_node) is on_head


# --- the SSH path with a scripted transport ------------------------------------------


class ScriptedTransport:
    """Answers `run` with a fixed result (or raises); records every argv."""

    def __init__(self, result: CommandResult | Exception):
        self.result = result
        self.commands: list[tuple[str, list[str]]] = []

    async def run(self, node: Any, argv: list[str], *, timeout: float) -> CommandResult:
        self.commands.append((node.name, list(argv)))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def _check(
    inventory: Inventory, transport: ScriptedTransport, this_node: str | None = None
) -> HealthVerdict:
    return await probe_model_health(
        inventory.model("m1"),
        inventory,
        transport=transport,  # type: ignore[arg-type]
        probe_from="auto",
        this_node=this_node,
    )


# What a probe on the head says it probed, from where (the re-check journals it)
ON_HEAD = "`mlx-medic node probe m1` on the head ai001, over SSH"


def _answer(up: bool, reason: str, conclusive: bool = True) -> str:
    """`mlx-medic node probe`'s document, as the helper prints it."""
    verdict = {"up": up, "conclusive": conclusive, "reason": reason, "latency_seconds": 0.1}
    return _document(verdict)


def _document(fields: dict[str, Any]) -> str:
    return json.dumps(helper_document("probe", {"model": "m1", **fields})) + "\n"


async def test_the_head_probe_is_the_probe_helper_with_the_nodes_medic_command() -> None:
    inventory = _two_node_inventory("0.0.0.0")
    transport = ScriptedTransport(CommandResult(0, _answer(True, "completed"), ""))
    verdict = await probe_model_health(
        inventory.model("m1"),
        inventory,
        transport=transport,  # type: ignore[arg-type]
        probe_from="head",
    )
    assert verdict == HealthVerdict.up("on ai001: completed").probed_as(ON_HEAD)
    assert transport.commands == [
        (
            "ai001",
            [
                "mlx-medic",
                "node",
                "probe",
                "m1",
                "--timeout",
                "10",
                "--inventory",
                "/etc/mlx-medic/inventory.yaml",
                "--node",
                "ai001",
                "--json",
                "--time-limit",  # the call's wait (REMOTE_PROBE_TIMEOUT)
                "35",
            ],
        )
    ]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            CommandResult(0, _answer(True, "completed a 1-token request"), ""),
            HealthVerdict.up("on ai001: completed a 1-token request").probed_as(ON_HEAD),
        ),
        (
            CommandResult(0, _answer(False, "connection refused"), ""),
            HealthVerdict.down("on ai001: connection refused").probed_as(ON_HEAD),
        ),
        (
            CommandResult(0, _answer(False, "not probed: busy", conclusive=False), ""),
            HealthVerdict.unknown("on ai001: not probed: busy").probed_as(ON_HEAD),
        ),
        (  # inconclusive is unknown, whatever `up` says
            CommandResult(0, _answer(True, "not probed: busy", conclusive=False), ""),
            HealthVerdict.unknown("on ai001: not probed: busy").probed_as(ON_HEAD),
        ),
    ],
)
async def test_the_helpers_verdict_is_up_down_or_inconclusive(
    result: CommandResult,
    expected: HealthVerdict,
) -> None:
    assert await _check(_two_node_inventory("127.0.0.1"), ScriptedTransport(result)) == expected


@pytest.mark.parametrize(
    ("result", "in_reason"),
    [
        (
            TransportError("cannot reach ai001 (ai@192.168.101.1:22): refused"),
            "could not probe on ai001: cannot reach ai001",
        ),
        (CommandResult(None, "", "", timed_out=True), "no answer within 35s"),
        (
            CommandResult(127, "", "sh: 1: mlx-medic: not found\n"),
            "mlx-medic on ai001 is not found at mlx-medic (sh: 1: mlx-medic: not found);"
            " fix: install mlx-medic on ai001 at mlx-medic (nodes.ai001.medic_command)",
        ),
        (CommandResult(0, "Traceback (most recent call last):\n", ""), "no helper document"),
        (CommandResult(0, _document({"up": "yes"}), ""), "gave no verdict"),
        (
            CommandResult(1, "", "mlx-medic node probe: cannot use the probe locks: ..."),
            "exit 1, no helper document: mlx-medic node probe: cannot use the probe locks",
        ),
        (CommandResult(2, "", "mlx-medic node probe: error: argument --timeout"), "exit 2"),
    ],
)
async def test_a_probe_that_could_not_run_or_said_nothing_clear_is_inconclusive(
    result: CommandResult | Exception,
    in_reason: str,
) -> None:
    verdict = await _check(_two_node_inventory("127.0.0.1"), ScriptedTransport(result))
    assert verdict.state is ModelState.UNKNOWN
    assert in_reason in verdict.reason


async def test_a_loopback_model_whose_head_we_are_is_probed_directly_without_ssh() -> None:
    inventory = _two_node_inventory("127.0.0.1", head_ssh="192.168.101.1")
    port = free_port()
    inventory = parse_inventory(
        yaml.safe_dump(inventory.model_dump(mode="json")).replace("8080", str(port))
    )
    transport = ScriptedTransport(AssertionError("no SSH when we are the head"))
    verdict = await _check(inventory, transport, this_node="ai001")
    assert transport.commands == []
    refused = HealthVerdict.down(f"connection refused: nothing listens on 127.0.0.1:{port}")
    assert verdict == refused.probed_as(f"127.0.0.1:{port} from this remediator's host (ai001)")


async def test_a_head_at_a_loopback_ssh_address_is_still_probed_over_ssh() -> None:
    inventory = _two_node_inventory("127.0.0.1", head_ssh="127.0.0.1")
    transport = ScriptedTransport(CommandResult(1, _answer(False, "connection refused"), ""))
    verdict = await _check(inventory, transport)
    assert [node for node, _argv in transport.commands] == ["ai001"]
    assert verdict == HealthVerdict.down("on ai001: connection refused").probed_as(ON_HEAD)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("-oProxyCommand=x", "starts with '-'"),
        ("/opt/mlx medic/bin/mlx-medic", "no spaces"),
        ("~/.venv/bin/mlx-medic", "'~' is never expanded"),
        ("mlx-medic;reboot", "is not a command name or path"),
    ],
)
def test_a_nodes_medic_command_must_be_one_plain_word(command: str, problem: str) -> None:
    text = yaml.safe_dump({"nodes": {"ai001": {"ssh": "10.0.0.1", "medic_command": command}}})
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text)
    assert "medic_command" in str(caught.value) and problem in str(caught.value)


def test_probe_from_accepts_only_auto_remediator_or_head() -> None:
    assert RemediatorConfig().probe_from == "auto"
    assert RemediatorConfig.model_validate({"probe_from": "head"}).probe_from == "head"
    with pytest.raises(ValueError, match="probe_from"):
        RemediatorConfig.model_validate({"probe_from": "exporter"})


# --- the real thing: mlx-medic node probe on the testbed's head over SSH --------------

SERVER = """
import sys
from tests.exporter.probe_servers import CountingCompletionServer
with CountingCompletionServer() as server:
    print(server.port, flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


def _medic_command_for(token: str, workdir: Path) -> Path:
    """An absolute-path mlx-medic for the nodes that also leaves a mark in the node's
    private /tmp: proof the probe ran on the head, not on this machine."""
    installed = Path(sys.executable).parent / "mlx-medic"
    run = (
        f'exec "{installed}" "$@"'
        if installed.exists()
        else f'exec "{sys.executable}" -m mlx_medic.cli "$@"'
    )
    script = workdir / f"mlx-medic-{token}"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "/tmp/medic-probe-{token}.log"\n'
        f'PYTHONPATH="{REPO}"; export PYTHONPATH\n'
        f"{run}\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def remote(clean_cluster: Any, testbed_workdir: Path) -> dict[str, Any]:
    token = uuid.uuid4().hex[:10]
    command = _medic_command_for(token, testbed_workdir)
    model = {
        "name": f"m-{token}",
        "model": "tiny",
        "nodes": ["ai001", "ai002"],
        "port": free_port(),
        "host": "127.0.0.1",
        "service": {"manager": "supervisord", "label": f"mlx-{token}"},
        "backends": {"ring": {"hostfile": f"/etc/mlx-medic/{token}.ring.json"}},
    }
    data = yaml.safe_load(clean_cluster.inventory_yaml([model]))
    data["nodes"]["ai001"]["medic_command"] = str(command)
    config = testbed_workdir / f"inventory-{token}.yaml"  # what the head's helpers read
    for node in data["nodes"].values():
        node["medic_config"] = str(config)
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return {
        "token": token,
        "command": command,
        "model": model["name"],
        "data": data,
        "marker": clean_cluster.node("ai001").tmp / f"medic-probe-{token}.log",
        "cluster": clean_cluster,
    }


@pytest.fixture
def server_in_head(remote: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A completion server started INSIDE ai001 on its 127.0.0.1; killed by pid."""
    node = remote["cluster"].node("ai001")
    popen = node.spawn(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    pids: list[int] = []
    try:
        pids.append(node.spawned_pid(popen))
        assert popen.stdout is not None
        port = int(popen.stdout.readline())
        wait_listening("127.0.0.1", port, timeout=10)
        yield {"port": port, "pid": pids[0], "popen": popen}
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        popen.kill()
        popen.wait(10)


def _inventory(remote: dict[str, Any], port: int | None = None, **node_changes: Any) -> Inventory:
    """The inventory with the changes, written where the head's helpers read it too: one
    inventory on every machine, as deployed (`node probe` takes the port from it)."""
    data = json.loads(json.dumps(remote["data"]))
    if port is not None:
        data["models"][remote["model"]]["port"] = port
    data["nodes"]["ai001"].update(node_changes)
    text = yaml.safe_dump(data, sort_keys=False)
    Path(data["nodes"]["ai001"]["medic_config"]).write_text(text)
    return parse_inventory(text)


async def _recheck(inventory: Inventory, made: list[SshTransport], model: str) -> HealthVerdict:
    transport = SshTransport(inventory)
    made.append(transport)
    return await probe_model_health(
        inventory.model(model),
        inventory,
        transport=transport,
        probe_from="head",
    )


@pytest.mark.testbed
async def test_a_model_serving_on_the_heads_loopback_is_up_when_probed_on_the_head(
    remote: dict[str, Any],
    server_in_head: dict[str, Any],
    ssh_transports: list[SshTransport],
) -> None:
    inventory = _inventory(remote, port=server_in_head["port"])
    verdict = await _recheck(inventory, ssh_transports, remote["model"])
    assert verdict.state is ModelState.UP, verdict
    assert verdict.reason.startswith("on ai001: completed a 1-token request")
    # the probe ran inside ai001, in the helper session the transport opened there: the
    # mlx-medic that runs it left its mark in ai001's private /tmp, not in ours
    assert "node session --inventory" in remote["marker"].read_text()
    assert not Path(f"/tmp/medic-probe-{remote['token']}.log").exists()


@pytest.mark.testbed
async def test_the_model_is_down_once_its_server_on_the_head_is_gone(
    remote: dict[str, Any],
    server_in_head: dict[str, Any],
    ssh_transports: list[SshTransport],
) -> None:
    port = server_in_head["port"]
    os.kill(server_in_head["pid"], signal.SIGKILL)
    server_in_head["popen"].wait(10)
    verdict = await _recheck(_inventory(remote, port=port), ssh_transports, remote["model"])
    assert verdict == HealthVerdict.down(
        f"on ai001: connection refused: nothing listens on 127.0.0.1:{port}"
    ).probed_as(f"`mlx-medic node probe {remote['model']}` on the head ai001, over SSH")
    assert remote["marker"].exists()


@pytest.mark.testbed
async def test_a_missing_medic_command_on_the_head_is_inconclusive_and_names_the_fix(
    remote: dict[str, Any],
    ssh_transports: list[SshTransport],
) -> None:
    missing = f"/nonexistent-{remote['token']}/bin/mlx-medic"
    inventory = _inventory(remote, medic_command=missing)
    verdict = await _recheck(inventory, ssh_transports, remote["model"])
    assert verdict.state is ModelState.UNKNOWN
    assert (
        f"could not probe on ai001: ai001: mlx-medic node probe: mlx-medic on ai001 is not"
        f" found at {missing}"
    ) in verdict.reason
    assert f"fix: install mlx-medic on ai001 at {missing}" in verdict.reason


def _engine(inventory: Inventory, tmp_path: Path, transport: SshTransport) -> Engine:
    config = RemediatorConfig.model_validate(
        {
            "journal": str(tmp_path / "journal.sqlite"),
            "probe_from": "head",
            "dry_run": True,
        }
    )
    return Engine(
        config, inventory, Journal(config.journal), transport, registry=CollectorRegistry()
    )


async def _one_alert_run(engine: Engine, model: Model) -> tuple[str, str, str]:
    """The run's outcome, detail and re-check."""
    await engine.start()
    try:
        await engine.submit(alert(uuid.uuid4().hex[:16], model.name))
        await engine.wait_idle(60)
        runs = engine.journal.list_runs(model=model.name)
        assert len(runs) == 1
        return runs[0].outcome, runs[0].detail, runs[0].recheck or ""
    finally:
        await engine.close()
        engine.journal.close()


@pytest.mark.testbed
async def test_the_engine_skips_a_stale_alert_for_a_model_up_on_its_heads_loopback(
    remote: dict[str, Any],
    server_in_head: dict[str, Any],
    ssh_transports: list[SshTransport],
    tmp_path: Path,
) -> None:
    inventory = _inventory(remote, port=server_in_head["port"])
    transport = SshTransport(inventory)
    ssh_transports.append(transport)
    engine = _engine(inventory, tmp_path, transport)
    outcome, detail, _ = await _one_alert_run(engine, inventory.model(remote["model"]))
    assert outcome == "skipped"
    assert detail.startswith("model is up again: on ai001: completed a 1-token request")


@pytest.mark.testbed
async def test_the_engine_acts_when_the_head_confirms_down_and_not_when_it_cannot_probe(
    remote: dict[str, Any],
    ssh_transports: list[SshTransport],
    tmp_path: Path,
) -> None:
    down = _inventory(remote)  # nothing listens on the model's port inside ai001
    transport = SshTransport(down)
    ssh_transports.append(transport)
    outcome, _, recheck = await _one_alert_run(
        _engine(down, tmp_path / "a", transport), down.model(remote["model"])
    )
    assert outcome == "planned"  # dry run: the playbook was planned, so it would act
    assert recheck.startswith("act: ") and "on the head ai001, over SSH" in recheck

    broken = _inventory(remote, medic_command=f"/nonexistent-{remote['token']}/mlx-medic")
    transport = SshTransport(broken)
    ssh_transports.append(transport)
    outcome, _, recheck = await _one_alert_run(
        _engine(broken, tmp_path / "b", transport), broken.model(remote["model"])
    )
    # a dry run plans whatever it could not check, and says what: mlx-medic missing on the
    # head, named with its fix (a live run ends misconfigured: tests/remediator/
    # test_misconfigured.py)
    assert outcome == "planned"
    assert recheck.startswith("not checked")
    assert f"/nonexistent-{remote['token']}/mlx-medic" in recheck and "fix: install" in recheck
