"""SshTransport against the testbed's real sshd nodes: argv stays argv, host keys
are checked, one connection per node is reused."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperTimedOut, NodeHelpers
from mlx_medic.transport import SshTransport, TransportError
from testbed.freezer import frozen
from tests.node.inventories import MEDIC, helper_inventory

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


# --- helper sessions -------------------------------------------------------------------------
def sessions_inventory(cluster, medic: str = MEDIC, **ssh: object) -> Inventory:
    path = helper_inventory(cluster, [], f"sessions-{uuid.uuid4().hex[:6]}")
    data = yaml.safe_load(path.read_text())
    data["ssh"] |= ssh
    for node in data["nodes"].values():
        node["medic_command"] = medic
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_inventory(path)


async def session_processes(ssh: SshTransport, inventory: Inventory, node: str) -> list[str]:
    """The node's `node session` processes for this inventory (`ps` run as a process)."""
    listing = await ssh.run(inventory.node(node), ["ps", "-eo", "pid,args"], timeout=10)
    config = str(inventory.node(node).medic_config)
    return [
        line for line in listing.stdout.splitlines() if f"node session --inventory {config}" in line
    ]


async def test_helper_calls_to_a_node_go_through_one_session_there(cluster) -> None:
    inventory = sessions_inventory(cluster)
    ssh = SshTransport(inventory)
    helpers = NodeHelpers(ssh, inventory, timeout=60)
    try:
        replies = await asyncio.gather(*(helpers.call("ai002", "drain", "show") for _ in range(6)))
        assert all(reply.ok and reply.document["drain"] is None for reply in replies)
        session = ssh._sessions["ai002"]
        assert (await helpers.call("ai002", "ledger")).document["node"] == "ai002"
        assert ssh._sessions["ai002"] is session
        (only,) = await session_processes(ssh, inventory, "ai002")
        assert int(only.split()[0]) == session.pid
    finally:
        await ssh.close()


async def test_a_session_that_ended_is_replaced_by_a_new_one_for_the_next_call(cluster) -> None:
    inventory = sessions_inventory(cluster)
    ssh = SshTransport(inventory)
    helpers = NodeHelpers(ssh, inventory, timeout=60)
    try:
        assert (await helpers.call("ai003", "drain", "show")).ok
        first = ssh._sessions["ai003"]
        assert first.pid is not None
        await ssh.run(inventory.node("ai003"), ["kill", "-9", str(first.pid)], timeout=10)
        await asyncio.sleep(0.3)
        assert (await helpers.call("ai003", "drain", "show")).ok
        assert ssh._sessions["ai003"] is not first and ssh._sessions["ai003"].pid != first.pid
    finally:
        await ssh.close()


async def test_a_node_whose_mlx_medic_runs_no_session_gets_a_process_per_call(
    cluster, caplog: pytest.LogCaptureFixture
) -> None:
    older = cluster.workdir / f"older-medic-{uuid.uuid4().hex[:6]}"
    older.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = session ]; then\n'
        "  echo \"mlx-medic node: error: argument HELPER: invalid choice: 'session'\" >&2\n"
        "  exit 2\n"
        "fi\n"
        f'exec {MEDIC} "$@"\n'
    )
    older.chmod(0o755)
    inventory = sessions_inventory(cluster, str(older))
    ssh = SshTransport(inventory)
    helpers = NodeHelpers(ssh, inventory, timeout=60)
    try:
        with caplog.at_level(logging.WARNING, logger="mlx_medic.transport.ssh"):
            for _ in range(3):
                assert (await helpers.call("ai002", "drain", "show")).ok
        assert "ai002" not in ssh._sessions
        (said,) = [r.getMessage() for r in caplog.records if "no helper session" in r.getMessage()]
        assert "invalid choice: 'session'" in said and "its own process" in said
    finally:
        await ssh.close()


async def test_with_helper_sessions_off_every_call_is_a_process_of_its_own(cluster) -> None:
    inventory = sessions_inventory(cluster, helper_sessions=False)
    ssh = SshTransport(inventory)
    helpers = NodeHelpers(ssh, inventory, timeout=60)
    try:
        assert (await helpers.call("ai002", "drain", "show")).ok
        assert ssh._sessions == {} and await session_processes(ssh, inventory, "ai002") == []
    finally:
        await ssh.close()


async def test_a_node_frozen_during_a_call_through_its_session_times_the_call_out(
    clean_cluster,
) -> None:
    """Every sshd process of the node frozen while a call waits in its session: the call
    is timed out at its wait, as a process per call would be; thawed, the node answers
    the next call."""
    inventory = sessions_inventory(clean_cluster)
    ssh = SshTransport(inventory)
    helpers = NodeHelpers(ssh, inventory, timeout=60)
    node = clean_cluster.node("ai003")
    try:
        assert (await helpers.call("ai003", "drain", "show")).ok  # its session is open
        with frozen(node.find_pids("sshd"), f"sshd-{uuid.uuid4().hex[:8]}"):
            started = asyncio.get_running_loop().time()
            with pytest.raises(HelperTimedOut):
                await helpers.call("ai003", "drain", "show", timeout=2)
            assert asyncio.get_running_loop().time() - started < 5
        assert (await helpers.call("ai003", "drain", "show")).ok
    finally:
        await ssh.close()
