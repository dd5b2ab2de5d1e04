"""The node transport interface: light to import, this node local, peers remote."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.inventory.schema import Node, SshSettings
from mlx_medic.transport import LocalTransport, RoutedTransport
from mlx_medic.transport.ssh_options import asyncssh_options, ssh_command_line
from tests.transport_fakes import RecordingTransport

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "module",
    [
        "mlx_medic.transport",
        "mlx_medic.transport.ssh_options",
        "mlx_medic.model_lock",
        "mlx_medic.processes.pid_liveness",
    ],
)
def test_importing_the_interface_or_the_lock_never_loads_asyncssh(module: str) -> None:
    probe = (
        f"import sys, json, {module}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncssh')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(out) == []


def test_the_ssh_transport_is_still_reachable_by_its_old_name() -> None:
    probe = (
        "import sys; from mlx_medic.transport import SshTransport; "
        "print(SshTransport.__module__, 'asyncssh' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == ["mlx_medic.transport.ssh", "True"]


def node(name: str) -> Node:
    return Node(name=name, ssh=f"{name}.example")


async def test_this_node_is_served_locally_and_every_peer_by_the_remote_transport(
    tmp_path: Path,
) -> None:
    local, remote = RecordingTransport(), RecordingTransport()
    routed = RoutedTransport("ai001", local, remote)
    for name in ("ai001", "ai002"):
        result = await routed.run(node(name), ["echo", name], timeout=10)
        assert result.ok and result.stdout == f"{name}\n"
    assert [n for n, _ in local.commands] == ["ai001"]
    assert [n for n, _ in remote.commands] == ["ai002"]
    await routed.close()


async def test_a_command_that_cannot_start_answers_as_a_shell_would_not_as_a_crash() -> None:
    result = await LocalTransport().run(node("ai001"), ["/nonexistent/mlx-medic"], timeout=10)
    assert result.exit_status == 127 and "/nonexistent/mlx-medic" in result.stderr


async def test_the_local_transport_keeps_no_history_of_what_it_ran() -> None:
    """The serve wrapper renews its lease through it every lease/4 for as long as it runs:
    nothing it runs may stay in memory."""
    transport = LocalTransport()
    before = dict(vars(transport))
    for _ in range(3):
        assert (await transport.run(node("ai001"), ["true"], timeout=10)).ok
    assert vars(transport) == before


def test_the_ssh_hint_connects_as_the_remediator_does_with_its_key_and_known_hosts() -> None:
    """On-call types it to check a node the remediator could not reach: the same key, the
    same known_hosts, no ~/.ssh/config, an unknown host key refused, no prompt."""
    settings = SshSettings(
        identity_file=Path("/etc/mlx-medic/keys/id ed25519"),
        known_hosts=Path("/etc/mlx-medic/known_hosts"),
        connect_timeout=2.5,
    )
    peer = Node(name="ai002", ssh="ai002.example", user="medic", port=2222)
    line = ssh_command_line(peer, settings, "true")
    assert shlex.split(line) == [
        "ssh",
        "-F",
        "none",
        "-i",
        "/etc/mlx-medic/keys/id ed25519",
        "-o",
        "UserKnownHostsFile=/etc/mlx-medic/known_hosts",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=3",
        "-p",
        "2222",
        "medic@ai002.example",
        "true",
    ]
    options = asyncssh_options(peer, settings)
    assert options["client_keys"] == ["/etc/mlx-medic/keys/id ed25519"]
    assert options["known_hosts"] == "/etc/mlx-medic/known_hosts" and options["config"] is None


def test_without_a_key_or_known_hosts_the_ssh_hint_uses_ssh_s_own_defaults() -> None:
    line = ssh_command_line(node("ai001"), SshSettings(), "true")
    assert "-i" not in shlex.split(line) and "UserKnownHostsFile" not in line
    assert line.endswith("-p 22 mlx-medic@ai001.example true")
