"""The remediator's key pinned by a `command=` forced command, with the testbed's real
sshd: an allowed helper runs; a shell, a second command, a path outside the inventory and
an unknown subcommand are refused; the key is accepted only where it was installed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.node.forced_command import EXIT_REFUSED
from mlx_medic.node.ledger import record_spend
from testbed import Cluster, SimNode
from testbed.cluster import SSH

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
    inventory = cluster.workdir / f"forced-{token}.yaml"
    inventory.write_text(cluster.inventory_yaml([{
        "name": "tiny", "model": "/models/tiny", "nodes": ["ai001", NODE], "port": 8080,
        "service": {"manager": "supervisord", "label": f"tiny-{token}"},
        "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
    }]))  # fmt: skip
    node = cluster.node(NODE)
    command = f"{sys.executable} -m mlx_medic.cli node forced-command --config.file {inventory}"
    key = node.install_forced_key(command)
    try:
        yield ForcedKey(node, key, inventory)
    finally:
        node.remove_forced_key()
        (node.state_dir / "pd-ledger.json").unlink(missing_ok=True)


def test_an_allowed_helper_runs_on_the_node_it_logged_into(forced_key: ForcedKey) -> None:
    record_spend(forced_key.node.state_dir, NODE, "sigkill", pid=4242, start_time=1.0,
                 boot_id=current_boot_id())  # fmt: skip
    result = forced_key.ssh("mlx-medic node ledger --json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["node"]) == (1, "ledger", NODE)
    assert document["debt"] == 1  # the ledger kept in that node's own state dir
    assert document["reserves"] == {"tiny": {"reserve": 5, "jaccl_allowed": True}}


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("sh -c id", "'sh' is not mlx-medic"),
        ("mlx-medic node ledger --json; id", "is not allowed"),
        ("mlx-medic node ledger --json ; id", "unexpected argument ';'"),
        ("mlx-medic node ledger --config.file /etc/passwd", "not the inventory's"),
        ("mlx-medic node reboot", "'node reboot' is not allowed"),
        ("id", "'id' is not mlx-medic"),
    ],
)
def test_anything_else_is_refused_and_nothing_runs(
    forced_key: ForcedKey, command: str, reason: str
) -> None:
    result = forced_key.ssh(command)
    assert result.returncode == EXIT_REFUSED
    assert "mlx-medic forced command: refused" in result.stderr and reason in result.stderr
    assert result.stdout == ""  # no `id` output: nothing ran


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
