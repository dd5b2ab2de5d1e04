"""The node transport interface: light to import, this node local, peers remote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.inventory.schema import Node
from mlx_medic.transport import LocalTransport, RoutedTransport
from tests.transport_fakes import RecordingTransport

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "module", ["mlx_medic.transport", "mlx_medic.model_lock", "mlx_medic.processes.pid_liveness"]
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
