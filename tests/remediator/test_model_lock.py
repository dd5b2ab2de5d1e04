"""The model lock on the head node: one holder at a time, stale only when its
holder is provably dead, never someone else's lock removed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from mlx_medic.inventory import Inventory, parse_inventory
from mlx_medic.model_lock import LockInfo, ModelLocks
from mlx_medic.transport import LocalTransport, SshTransport
from tests.remediator.engine_fakes import MODEL, dead_pid, make_inventory


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inventory() -> Inventory:
    return make_inventory()


@pytest.fixture
def transport(tmp_path: Path) -> LocalTransport:
    return LocalTransport(tmp_path / "nodes")


def locks(inventory: Inventory, transport: LocalTransport, host: str, clock: Clock | None = None,
          **kwargs) -> ModelLocks:
    return ModelLocks(inventory, transport, hostname=host, clock=clock or Clock(), **kwargs)


def lock_file(tmp_path: Path, inventory: Inventory) -> Path:
    """Where the lock of MODEL lands on its head node (ai001) in the LocalTransport layout."""
    path = inventory.state_dir / "locks" / f"{MODEL}.lock"
    return tmp_path / "nodes" / "ai001" / path.relative_to("/")


def plant(tmp_path: Path, inventory: Inventory, **fields) -> None:
    info = {"host": "elsewhere", "pid": 1, "time": 0.0, "holder": "remediator", "run_id": "9",
            "expires": 0.0, **fields}
    path = lock_file(tmp_path, inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))


async def test_the_lock_lives_on_the_head_node_and_holds_who_took_it(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    handle = await locks(inventory, transport, "replica-a").acquire(
        MODEL, "remediator", "17", renew=False)
    assert handle is not None and handle.node.name == "ai001"
    info = LockInfo.parse(lock_file(tmp_path, inventory).read_text())
    assert (info.host, info.pid, info.holder, info.run_id) == ("replica-a", os.getpid(),
                                                                "remediator", "17")
    assert info.expires > info.time


async def test_a_second_holder_is_refused_with_the_name_of_the_first(
    inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    b = locks(inventory, transport, "replica-b")
    first = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert first is not None
    assert await b.acquire(MODEL, "manual", "2", renew=False) is None
    assert "locked by remediator (run 1" in b.refusals[MODEL] and "replica-a" in b.refusals[MODEL]
    await a.release(first)
    assert await b.acquire(MODEL, "manual", "2", renew=False) is not None


async def test_release_never_removes_a_lock_that_is_no_longer_ours(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    handle = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert handle is not None
    plant(tmp_path, inventory, host="replica-b", run_id="2", expires=2e9)  # taken over
    await a.release(handle)
    assert lock_file(tmp_path, inventory).exists()


async def test_a_lock_of_a_dead_pid_on_this_host_is_stale_at_once(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    plant(tmp_path, inventory, host="replica-a", pid=dead_pid(), expires=2e9)
    handle = await locks(inventory, transport, "replica-a").acquire(MODEL, "remediator", "5",
                                                                    renew=False)
    assert handle is not None and handle.info.run_id == "5"


async def test_a_lock_of_a_live_pid_on_this_host_is_held_whatever_its_lease(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    plant(tmp_path, inventory, host="replica-a", pid=os.getppid(), expires=0.0)
    assert await locks(inventory, transport, "replica-a").acquire(MODEL, "manual", "5") is None


async def test_a_holder_elsewhere_is_judged_by_its_lease(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    clock = Clock(1000.0)
    b = locks(inventory, transport, "replica-b", clock)
    plant(tmp_path, inventory, host="replica-a", pid=os.getpid(), expires=1100.0)
    assert await b.acquire(MODEL, "remediator", "7", renew=False) is None
    clock.now = 1101.0
    handle = await b.acquire(MODEL, "remediator", "7", renew=False)
    assert handle is not None and handle.info.host == "replica-b"


async def test_a_holder_on_the_head_node_is_judged_by_its_pid_there(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    # The serve wrapper on the head names its node; `ps -p` on the head decides
    # (LocalTransport runs it here, where these pids live).
    remote = locks(inventory, transport, "remediator-host")
    plant(tmp_path, inventory, host="head-host", node="ai001", holder="serve",
          pid=os.getpid(), expires=0.0)
    assert await remote.acquire(MODEL, "remediator", "8", renew=False) is None
    assert "locked by serve" in remote.refusals[MODEL]
    plant(tmp_path, inventory, host="head-host", node="ai001", holder="serve",
          pid=dead_pid(), expires=2e9)
    assert await remote.acquire(MODEL, "remediator", "8", renew=False) is not None


async def test_an_unreadable_lock_file_counts_as_held(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    path = lock_file(tmp_path, inventory)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    a = locks(inventory, transport, "replica-a")
    assert await a.acquire(MODEL, "remediator", "1") is None
    assert "unreadable lock file" in a.refusals[MODEL]


async def test_renewal_extends_the_lease_while_the_lock_is_ours(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    clock = Clock(1000.0)
    a = locks(inventory, transport, "replica-a", clock, lease=60.0)
    handle = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert handle is not None
    clock.now = 1050.0
    assert await a.renew(handle)
    assert LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires == 1110.0
    await a.release(handle)
    assert not await a.renew(handle)


async def test_start_up_releases_only_this_hosts_locks_of_dead_pids(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    plant(tmp_path, inventory, host="replica-b", pid=dead_pid(), expires=2e9)
    assert await a.release_stale_of_this_host(MODEL) is None
    plant(tmp_path, inventory, host="replica-a", pid=os.getpid(), expires=2e9)
    assert await a.release_stale_of_this_host(MODEL) is None
    pid = dead_pid()
    plant(tmp_path, inventory, host="replica-a", pid=pid, expires=2e9)
    released = await a.release_stale_of_this_host(MODEL)
    assert released is not None and released.pid == pid
    assert not lock_file(tmp_path, inventory).exists()


async def test_a_holder_name_outside_the_known_set_is_refused(
    inventory: Inventory, transport: LocalTransport
) -> None:
    with pytest.raises(ValueError, match="holder must be one of"):
        await locks(inventory, transport, "a").acquire(MODEL, "cron", "1")


async def test_the_lease_is_renewed_in_the_background_while_the_lock_is_held(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = ModelLocks(inventory, transport, hostname="replica-a", lease=3.0)
    handle = await a.acquire(MODEL, "remediator", "1")
    assert handle is not None and handle.renewer is not None
    first = LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires
    await asyncio.sleep(1.5)
    assert LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires > first
    await a.release(handle)
    assert handle.renewer.done() and not lock_file(tmp_path, inventory).exists()


@pytest.mark.testbed
async def test_over_ssh_a_serve_wrapper_holder_on_the_head_is_judged_by_its_pid_there(
    clean_cluster,
) -> None:
    cluster = clean_cluster
    model = {
        "name": "tiny", "model": "/models/tiny", "nodes": ["ai001", "ai002"], "port": 18082,
        "service": {"manager": "supervisord", "label": "tiny"},
        "backends": {"ring": {"hostfile": "/etc/ring.json"}},
    }
    inventory = parse_inventory(cluster.inventory_yaml([model]))
    ssh = SshTransport(inventory)
    head = cluster.node("ai001")
    sleeper = head.spawn(["sleep", "300"])
    try:
        host_pid = head.spawned_pid(sleeper)
        ns_pid = head.ns_pid_of(host_pid)
        serve = ModelLocks(inventory, LocalTransport(), hostname="head-host", node_name="ai001",
                           pid=ns_pid)
        assert serve.path_for("tiny") == inventory.state_dir / "locks" / "tiny.lock"
        lock = head.host_path(serve.path_for("tiny"))
        lock.parent.mkdir(parents=True, exist_ok=True)
        info = serve._info("serve", "run-1")
        lock.write_text(info.to_json())  # as the wrapper on the head wrote it, lease long over
        remote = ModelLocks(inventory, ssh, hostname="remediator-host", clock=lambda: 2e9)
        assert await remote.acquire("tiny", "remediator", "7", renew=False) is None
        assert "locked by serve" in remote.refusals["tiny"]
        os.kill(host_pid, signal.SIGKILL)  # the wrapper dies; its pid is gone on the head
        sleeper.wait(timeout=10)
        handle = await remote.acquire("tiny", "remediator", "7", renew=False)
        assert handle is not None, remote.refusals
        assert json.loads(lock.read_text())["host"] == "remediator-host"
        await remote.release(handle)
        assert not lock.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        await ssh.close()
