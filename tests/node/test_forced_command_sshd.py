"""Each key pinned by a `command=` forced command with its own table, with the testbed's
real sshd: every call the remediator and the serve wrapper make with their key passes
(their own code, over SSH), a helper or an option outside the key's table is refused and
nothing runs, as are a shell, a second command and a path outside the inventory; the key
is accepted only where it was installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.model_lock import LockHandle, ModelLocks
from mlx_medic.node.cli import helper_document
from mlx_medic.node.client import NodeHelpers, helper_argv
from mlx_medic.node.forced_command import EXIT_REFUSED
from mlx_medic.node.key_table import KeyName
from mlx_medic.remediator.playbooks.finish_stop import read_stop_record
from mlx_medic.serve.nodes import ModelNodes
from mlx_medic.serve.start import prepare_nodes
from mlx_medic.serve.teardown import end_run, teardown_deadline
from mlx_medic.state.runs import new_run_id
from mlx_medic.transport import CommandResult, RoutedTransport, SshTransport
from testbed import Cluster, SimNode, free_port
from testbed.cluster import SSH
from tests.node.inventories import helper_inventory

NODE = "ai002"  # a peer of `tiny` (head ai001), the head of `second`
RUN = "20261130T021500Z-1a2b3c4d"


@dataclass
class ForcedKey:
    node: SimNode
    key: Path
    inventory: Path

    def ssh(self, command: str, node: SimNode | None = None) -> subprocess.CompletedProcess[str]:
        argv = (node or self.node).ssh_argv(command, identity=self.key)
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )

    def parsed(self) -> Inventory:
        """The inventory as the key's user reads it: logging in with this key."""
        data = yaml.safe_load(self.inventory.read_text())
        data["ssh"]["identity_file"] = str(self.key)
        return parse_inventory(yaml.safe_dump(data))


def installed(cluster: Cluster, key: KeyName) -> Iterator[ForcedKey]:
    token = uuid.uuid4().hex[:8]
    inventory = helper_inventory(
        cluster,
        [
            {
                "name": "tiny",
                "model": "/models/tiny",
                "nodes": ["ai001", NODE],
                "port": free_port(),
                "service": {"manager": "supervisord", "label": f"tiny-{token}"},
                "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
            },
            {
                "name": "second",
                "model": "/models/s",
                "nodes": [NODE, "ai003"],
                "port": free_port(),
                "service": {"manager": "supervisord", "label": f"s-{token}"},
                "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
            },
            {
                "name": "elsewhere",
                "model": "/models/e",
                "nodes": ["ai003"],
                "port": 8081,
                "service": {"manager": "supervisord", "label": f"e-{token}"},
                "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
            },
        ],
        "forced",
    )
    node = cluster.node(NODE)
    command = (
        f"{sys.executable} -m mlx_medic.cli node forced-command --inventory {inventory} --key {key}"
    )
    path = node.install_forced_key(command)
    try:
        yield ForcedKey(node, path, inventory)
    finally:
        node.remove_forced_key()
        for name in ("runs", "locks"):
            for entry in (node.state_dir / name).glob("*"):
                entry.unlink(missing_ok=True)


@pytest.fixture
def forced_key(cluster: Cluster) -> Iterator[ForcedKey]:
    """The remediator's key, as its rendered line says (`--key remediator`)."""
    yield from installed(cluster, "remediator")


@pytest.fixture
def serve_key(cluster: Cluster) -> Iterator[ForcedKey]:
    yield from installed(cluster, "serve")


def test_an_allowed_helper_runs_on_the_node_it_logged_into(forced_key: ForcedKey) -> None:
    result = forced_key.ssh("mlx-medic node facts tiny --json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["node"]) == (1, "facts", NODE)
    assert document["memory"]["available_bytes"] > 0  # that node's own facts
    alive = json.loads(forced_key.ssh("mlx-medic node pid-alive 1 --json").stdout)
    assert alive["liveness"] == "alive"  # the node's own pid 1: its sshd


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("sh -c id", "'sh' is not mlx-medic"),
        ("mlx-medic node facts tiny --json; id", "unrecognized arguments: --json; id"),
        ("mlx-medic node facts tiny --json ; id", "unrecognized arguments: ; id"),
        ("mlx-medic node facts tiny --inventory /etc/passwd", "not the inventory's"),
        ("mlx-medic node drain show", "the remediator key never sends 'drain show'"),
        ("mlx-medic node reboot --now", "node reboot: unrecognized arguments: --now"),
        ("id", "'id' is not mlx-medic"),
        ("mlx-medic node sweep tiny --start-sweep", "never sends --start-sweep"),
        ("mlx-medic node ledger --json", "'node ledger' is not allowed for the remediator key"),
        (f"mlx-medic node run tiny set {RUN}", "'node run' is not allowed for the remediator key"),
        ("mlx-medic node facts elsewhere", "'elsewhere' is not an inventory model placed"),
        ("mlx-medic node facts tiny --node ai001", "--node 'ai001' is not this node (ai002)"),
        ("mlx-medic node facts tiny 'x; id'; id", "unrecognized arguments: x; id; id"),
    ],
)
def test_anything_else_is_refused_and_nothing_runs(
    forced_key: ForcedKey, command: str, reason: str
) -> None:
    result = forced_key.ssh(command)
    assert result.returncode == EXIT_REFUSED
    assert "mlx-medic forced command: refused" in result.stderr and reason in result.stderr
    assert result.stdout == ""  # no `id` output: nothing ran


async def refused(transport: SshTransport, node: Node, *argv: str) -> CommandResult:
    """A helper outside the key's table, sent as its user's code would send it."""
    return await transport.run(node, helper_argv(node, argv[0], argv[1:]), timeout=60)


async def test_the_remediators_calls_pass_its_key_and_a_helper_outside_its_table_does_not(
    forced_key: ForcedKey,
) -> None:
    """Its own code over SSH: a step's helper, finish-stop's re-check, the whole model lock
    (take, renew, release) on the head of `second`; then what only the wrapper sends."""
    inventory = forced_key.parsed()
    transport = SshTransport(inventory)
    try:
        helpers = NodeHelpers(transport, inventory, timeout=60)
        facts = await helpers.call(NODE, "facts", "second")
        assert facts.ok and facts.argv[0] == inventory.node(NODE).medic_command, facts.stderr
        assert await read_stop_record(helpers, inventory.model("second")) is None
        locks = ModelLocks(inventory, transport, this_node=None, hostname="replica-a")
        handle = await locks.acquire("second", "remediator", "7", renew=False)
        assert isinstance(handle, LockHandle), handle
        assert await locks.renew(handle)
        await locks.release(handle)
        assert not (forced_key.node.state_dir / "locks" / "second.lock").exists()
        node = inventory.node(NODE)
        for argv in (
            ["run", "tiny", "set", RUN, "--lease", "10", "--holder", "serve pid 7 on ai001"],
            ["sweep", "tiny", "--start-sweep", "--grace", "0.25"],
            ["ledger"],
        ):
            result = await refused(transport, node, *argv)
            assert result.exit_status == EXIT_REFUSED and "refused" in result.stderr, argv
        assert not (forced_key.node.state_dir / "runs" / "tiny.current").exists()
        shell = await transport.run(node, ["sh", "-c", "id"], timeout=60)
        assert shell.exit_status == EXIT_REFUSED and "is not mlx-medic" in shell.stderr
    finally:
        await transport.close()


class HeadHere:
    """The wrapper's own head, reached without SSH (no key): answered here, recorded."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        self.sent.append(argv)
        document = helper_document(argv[2], {"settled": True, "complete": True})
        return CommandResult(0, json.dumps(document) + "\n", "")

    async def close(self) -> None:
        return None


async def test_the_serve_wrappers_calls_to_a_peer_pass_its_key_and_nothing_else_does(
    serve_key: ForcedKey,
) -> None:
    """The wrapper's own code (start sweep, run record, clean, teardown) to its peer
    ai002 with its key, as `mlx-medic serve` routes it; then what only the remediator
    sends, and the peer's own helper outside both tables."""
    inventory = serve_key.parsed()
    model = inventory.model("tiny")
    peers = SshTransport(inventory)
    transport = RoutedTransport(model.head, HeadHere(), peers)
    holder = f"serve pid {os.getpid()} on {model.head}"
    run_id = new_run_id()
    current = serve_key.node.state_dir / "runs" / "tiny.current"
    try:
        nodes = ModelNodes(NodeHelpers(transport, inventory, 60.0), model, 60.0)
        prepared = await prepare_nodes(nodes, run_id, model.serve.lease, holder, lambda: None)
        assert await prepared.cleaning == []
        assert current.read_text().strip() == run_id  # recorded on the peer, for real
        assert await nodes.renew_run(run_id, model.serve.lease, holder) == []
        assert await end_run(nodes, run_id, None, teardown_deadline(model)) == []
        node = inventory.node(NODE)
        for argv in (
            ["facts", "tiny"],
            ["lock", "second", "show"],
            ["sweep", "tiny"],
            ["run", "tiny", "show"],
            ["ledger"],
        ):
            result = await refused(peers, node, *argv)
            assert result.exit_status == EXIT_REFUSED and "refused" in result.stderr, argv
    finally:
        await transport.close()


def test_a_login_without_a_command_gets_no_shell(forced_key: ForcedKey) -> None:
    result = forced_key.ssh("")
    assert result.returncode == EXIT_REFUSED and "no command given" in result.stderr


def test_the_key_is_accepted_only_on_the_node_it_was_installed_on(
    cluster: Cluster, forced_key: ForcedKey
) -> None:
    def with_only_the_forced_key(node: SimNode) -> subprocess.CompletedProcess[str]:
        argv = [
            SSH,
            "-F",
            "/dev/null",
            "-i",
            str(forced_key.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={cluster.known_hosts}",
            "-o",
            "BatchMode=yes",
            "-p",
            str(node.ssh_port),
            f"root@{node.address}",
            "mlx-medic node pid-alive 1 --json",
        ]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )

    assert with_only_the_forced_key(cluster.node(NODE)).returncode == 0
    other = with_only_the_forced_key(cluster.node("ai003"))
    assert other.returncode == 255 and "Permission denied" in other.stderr
    assert cluster.node(NODE).run("echo shell").stdout.strip() == "shell"  # cluster key: as before
