"""SshTransport against the testbed's real sshd nodes: argv stays argv, host keys
are checked, one connection per node is reused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.transport import SshTransport, TransportError

pytestmark = pytest.mark.testbed


@pytest.fixture
def inventory(cluster) -> Inventory:
    return parse_inventory(cluster.inventory_yaml([]))


@pytest.fixture
async def transport(inventory: Inventory) -> AsyncIterator[SshTransport]:
    ssh = SshTransport(inventory)
    yield ssh
    await ssh.close()


async def test_a_command_runs_on_the_node_and_returns_its_exit_status_and_output(
    transport: SshTransport, inventory: Inventory, cluster
) -> None:
    node = inventory.node("ai002")
    result = await transport.run(node, ["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=10)
    assert (result.exit_status, result.stdout, result.stderr) == (7, "out\n", "err\n")
    # the node has its own /tmp: a file made there is not on this host
    token = uuid.uuid4().hex
    await transport.run(node, ["touch", f"/tmp/{token}"], timeout=10)
    assert (cluster.node("ai002").tmp / token).exists()
    assert not Path(f"/tmp/{token}").exists()


async def test_shell_syntax_in_an_argument_stays_one_word_and_runs_nothing(
    transport: SshTransport, inventory: Inventory, cluster
) -> None:
    node = inventory.node("ai002")
    canary = f"/tmp/CANARY-{uuid.uuid4().hex}"
    for hostile in (
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x\ntouch {canary}",
        f"' ; touch {canary} ; '",
    ):
        result = await transport.run(node, ["printf", "%s", hostile], timeout=10)
        assert result.stdout == hostile
    assert not cluster.node("ai002").host_path(canary).exists()


async def test_one_connection_per_node_is_reused(
    transport: SshTransport, inventory: Inventory
) -> None:
    node = inventory.node("ai003")
    await transport.run(node, ["true"], timeout=10)
    first = transport._connections[node.name]
    await asyncio.gather(*(transport.run(node, ["true"], timeout=10) for _ in range(5)))
    assert transport._connections[node.name] is first


async def test_a_command_past_its_timeout_is_reported_as_timed_out(
    transport: SshTransport, inventory: Inventory
) -> None:
    result = await transport.run(inventory.node("ai002"), ["sleep", "5"], timeout=0.5)
    assert result.timed_out and result.exit_status is None


async def test_an_unknown_host_key_is_refused(tmp_path: Path, cluster) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inventory = parse_inventory(
        cluster.inventory_yaml(
            [],
            ssh={
                "identity_file": str(cluster.identity),
                "known_hosts": str(empty),
                "connect_timeout": "5s",
            },
        )
    )
    ssh = SshTransport(inventory)
    try:
        with pytest.raises(TransportError, match="cannot reach ai002"):
            await ssh.run(inventory.node("ai002"), ["true"], timeout=10)
    finally:
        await ssh.close()


async def test_an_unreachable_node_is_a_transport_error_not_a_result(cluster) -> None:
    inventory = parse_inventory(
        cluster.inventory_yaml([]).replace(cluster.node("ai003").address, "127.0.0.254")
    )
    ssh = SshTransport(inventory)
    try:
        with pytest.raises(TransportError):
            await ssh.run(inventory.node("ai003"), ["true"], timeout=5)
    finally:
        await ssh.close()


async def test_a_connection_lost_between_commands_is_replaced_transparently(
    clean_cluster,
) -> None:
    inventory = parse_inventory(clean_cluster.inventory_yaml([]))
    ssh = SshTransport(inventory)
    node = inventory.node("ai003")
    try:
        assert (await ssh.run(node, ["true"], timeout=10)).ok
        clean_cluster.node("ai003").kill_all_but_sshd()  # ends our session's sshd process
        await asyncio.sleep(0.2)
        assert (await ssh.run(node, ["echo", "back"], timeout=10)).stdout == "back\n"
    finally:
        await ssh.close()
