"""The remediator's key pinned by a `command=` forced command, with the testbed's real
sshd: an allowed helper runs; a shell, a second command, a path outside the inventory and
an unknown subcommand are refused; the key is accepted only where it was installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mlx_medic.inventory import parse_inventory
from mlx_medic.node.client import NodeHelpers
from mlx_medic.node.forced_command import EXIT_REFUSED
from mlx_medic.node.ledger import record_spend
from mlx_medic.transport import SshTransport
from testbed import Cluster, SimNode
from testbed.cluster import SSH
from tests.node.inventories import helper_inventory

NODE = "ai002"


@dataclass
class ForcedKey:
    node: SimNode
    key: Path
    inventory: Path

    def ssh(self, command: str, node: SimNode | None = None) -> subprocess.CompletedProcess[str]:
        argv = (node or self.node).ssh_argv(command, identity=self.key)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture
def forced_key(cluster: Cluster) -> Iterator[ForcedKey]:
    token = uuid.uuid4().hex[:8]
    inventory = helper_inventory(cluster, [{
        "name": "tiny", "model": "/models/tiny", "nodes": ["ai001", NODE], "port": 8080,
        "service": {"manager": "supervisord", "label": f"tiny-{token}"},
        "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
    }, {
        "name": "elsewhere", "model": "/models/e", "nodes": ["ai003"], "port": 8081,
        "service": {"manager": "supervisord", "label": f"e-{token}"},
        "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
    }], "forced")  # fmt: skip
    node = cluster.node(NODE)
    command = f"{sys.executable} -m mlx_medic.cli node forced-command --config.file {inventory}"
    key = node.install_forced_key(command)
    try:
        yield ForcedKey(node, key, inventory)
    finally:
        node.remove_forced_key()
        (node.state_dir / "pd-ledger.json").unlink(missing_ok=True)
        shutil.rmtree(node.state_dir / "runs", ignore_errors=True)


def test_an_allowed_helper_runs_on_the_node_it_logged_into(forced_key: ForcedKey) -> None:
    record_spend(forced_key.node.state_dir, NODE, "sigkill", pid=4242, start_time=1.0,
                 boot_id=forced_key.node.boot_id)  # the node's own boot
    result = forced_key.ssh("mlx-medic node ledger --json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["node"]) == (1, "ledger", NODE)
    assert document["debt"] == 1  # the ledger kept in that node's own state dir
    assert document["reserves"] == {
        "tiny": {"reserve": 5, "devices": [], "jaccl_allowed": True, "debt": 1}}


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("sh -c id", "'sh' is not mlx-medic"),
        ("mlx-medic node ledger --json; id", "unrecognized arguments: --json; id"),
        ("mlx-medic node ledger --json ; id", "unrecognized arguments: ; id"),
        ("mlx-medic node ledger --config.file /etc/passwd", "not the inventory's"),
        ("mlx-medic node reboot", "'node reboot' is not allowed"),
        ("id", "'id' is not mlx-medic"),
        ("mlx-medic node sweep tiny --start-sweep", "--start-sweep is never allowed"),
        ("mlx-medic node run elsewhere show", "'elsewhere' is not an inventory model placed"),
        ("mlx-medic node run tiny show --node ai001", "--node 'ai001' is not this node (ai002)"),
        ("mlx-medic node run tiny set 'r-1; id'; id", "unrecognized arguments: id"),
    ],
)
def test_anything_else_is_refused_and_nothing_runs(
    forced_key: ForcedKey, command: str, reason: str
) -> None:
    result = forced_key.ssh(command)
    assert result.returncode == EXIT_REFUSED
    assert "mlx-medic forced command: refused" in result.stderr and reason in result.stderr
    assert result.stdout == ""  # no `id` output: nothing ran


def test_the_state_helpers_run_through_the_key_on_its_node(forced_key: ForcedKey) -> None:
    def document(command: str) -> dict:
        result = forced_key.ssh(command)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    assert document("mlx-medic node run tiny set r-7 --json")["current"] == "r-7"
    assert (forced_key.node.state_dir / "runs" / "tiny.current").read_text() == "r-7\n"
    assert document("mlx-medic node run tiny show --json")["current"] == "r-7"
    alive = document("mlx-medic node pid-alive 1 --json")  # the node's own pid 1: its sshd
    assert alive["liveness"] == "alive"
    facts = document("mlx-medic node facts tiny --json")
    assert facts["node"] == NODE and facts["memory"]["available_bytes"] > 0


async def test_the_remediators_helper_calls_pass_the_forced_command(
    forced_key: ForcedKey,
) -> None:
    """NodeHelpers' own argv (medic_command, medic_config, --node, --json) through the key."""
    data = yaml.safe_load(forced_key.inventory.read_text())
    data["ssh"]["identity_file"] = str(forced_key.key)
    inventory = parse_inventory(yaml.safe_dump(data))
    transport = SshTransport(inventory)
    try:
        helpers = NodeHelpers(transport, inventory, timeout=60)
        reply = await helpers.call(NODE, "pid-alive", "1")
        assert reply.ok and reply.document["liveness"] == "alive", reply.stderr
        assert reply.argv[0] == inventory.node(NODE).medic_command
        refused = await transport.run(inventory.node(NODE), ["sh", "-c", "id"], timeout=60)
        assert refused.exit_status == EXIT_REFUSED and "is not mlx-medic" in refused.stderr
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
            SSH, "-F", "/dev/null", "-i", str(forced_key.key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "BatchMode=yes",
            "-p", str(node.ssh_port), f"root@{node.address}", "mlx-medic node ledger --json",
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    assert with_only_the_forced_key(cluster.node(NODE)).returncode == 0
    other = with_only_the_forced_key(cluster.node("ai003"))
    assert other.returncode == 255 and "Permission denied" in other.stderr
    assert cluster.node(NODE).run("echo shell").stdout.strip() == "shell"  # cluster key: as before
