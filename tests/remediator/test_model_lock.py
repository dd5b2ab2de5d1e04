"""The model lock on the head node: one holder at a time, stale only when its
holder is provably dead, never someone else's lock removed. A holder that names its
node is asked about on that node; a holder without one is judged by its lease."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.model_lock import LockHandle, LockInfo, LockRefused, ModelLocks, lock_path
from mlx_medic.transport import CommandResult, LocalTransport, SshTransport, TransportError
from tests.node.inventories import helper_inventory
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
    return LocalTransport()


def locks(
    inventory: Inventory,
    transport: LocalTransport,
    host: str,
    clock: Clock | None = None,
    *,
    this_node: str | None = None,
    **kwargs,
) -> ModelLocks:
    return ModelLocks(
        inventory, transport, this_node=this_node, hostname=host, clock=clock or Clock(), **kwargs
    )


def lock_file(tmp_path: Path, inventory: Inventory) -> Path:
    """Where the lock of MODEL lands on its head node (ai001): the `lock` helper, run here
    through the LocalTransport, keeps it in the inventory's state dir."""
    return inventory.state_dir / "locks" / f"{MODEL}.lock"


def plant(tmp_path: Path, inventory: Inventory, **fields) -> None:
    info = {
        "host": "elsewhere",
        "pid": 1,
        "time": 0.0,
        "holder": "remediator",
        "run_id": "9",
        "expires": 0.0,
        **fields,
    }
    path = lock_file(tmp_path, inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))


def started_at(pid: int) -> float:
    return psutil.Process(pid).create_time()


async def test_the_lock_lives_on_the_head_node_and_holds_who_took_it(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    handle = await locks(inventory, transport, "replica-a").acquire(
        MODEL, "remediator", "17", renew=False
    )
    assert isinstance(handle, LockHandle) and handle.node.name == "ai001"
    info = LockInfo.parse(lock_file(tmp_path, inventory).read_text())
    assert (info.host, info.pid, info.holder, info.run_id) == (
        "replica-a",
        os.getpid(),
        "remediator",
        "17",
    )
    assert info.expires > info.time


async def test_a_second_holder_is_refused_with_the_name_of_the_first(
    inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    b = locks(inventory, transport, "replica-b")
    first = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert isinstance(first, LockHandle)
    refused = await b.acquire(MODEL, "manual", "2", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert "locked by remediator (run 1" in refused.why and "replica-a" in refused.why
    await a.release(first)
    assert isinstance(await b.acquire(MODEL, "manual", "2", renew=False), LockHandle)


async def test_release_never_removes_a_lock_that_is_no_longer_ours(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    handle = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert isinstance(handle, LockHandle)
    plant(tmp_path, inventory, host="replica-b", run_id="2", expires=2e9)  # taken over
    await a.release(handle)
    assert lock_file(tmp_path, inventory).exists()


async def test_a_holder_on_a_named_node_whose_pid_is_gone_there_is_stale_at_once(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    # LocalTransport asks "ai002" here, where this pid lived.
    plant(tmp_path, inventory, node="ai002", pid=dead_pid(), expires=2e9)
    handle = await locks(inventory, transport, "replica-a").acquire(
        MODEL, "remediator", "5", renew=False
    )
    assert isinstance(handle, LockHandle) and handle.info.run_id == "5"


async def test_a_holder_on_a_named_node_whose_pid_lives_there_is_held_whatever_its_lease(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    parent = os.getppid()
    plant(tmp_path, inventory, node="ai002", pid=parent, pid_start=started_at(parent), expires=0.0)
    a = locks(inventory, transport, "replica-a")
    refused = await a.acquire(MODEL, "manual", "5")
    assert isinstance(refused, LockRefused), refused
    assert f"pid {parent} on node ai002" in refused.why


async def test_a_reused_pid_is_not_the_holder(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    # The pid lives, but it started long after the holder recorded its start: another process.
    me = os.getpid()
    plant(tmp_path, inventory, node="ai002", pid=me, pid_start=started_at(me) - 3600, expires=2e9)
    a = locks(inventory, transport, "replica-a")
    assert isinstance(await a.acquire(MODEL, "remediator", "6", renew=False), LockHandle)


async def test_a_host_name_and_a_pid_decide_nothing_for_a_holder_without_a_node(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    # Same host name as ours and a pid that is dead here: that pid may live in another
    # PID namespace of a machine with the same name (the testbed's nodes), so only the
    # lease can free it.
    clock = Clock(1000.0)
    plant(tmp_path, inventory, host="replica-a", pid=dead_pid(), expires=1100.0)
    a = locks(inventory, transport, "replica-a", clock)
    assert isinstance(await a.acquire(MODEL, "remediator", "5", renew=False), LockRefused)
    clock.now = 1101.0
    assert isinstance(await a.acquire(MODEL, "remediator", "5", renew=False), LockHandle)


class Unreachable(LocalTransport):
    """The head answers; nothing reaches ai003."""

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if node.name == "ai003":
            raise TransportError(f"cannot reach {node.name}")
        return await super().run(node, argv, timeout=timeout)


async def test_a_holder_on_a_node_we_cannot_reach_counts_as_held(
    tmp_path: Path, inventory: Inventory
) -> None:
    plant(tmp_path, inventory, node="ai003", pid=dead_pid(), expires=0.0)
    a = locks(inventory, Unreachable(), "replica-a")
    refused = await a.acquire(MODEL, "remediator", "5", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert "cannot check its pid on ai003" in refused.why
    # not "someone holds it": we cannot tell
    assert (refused.kind, refused.node) == ("unreachable", "ai003")


class HeadUnreachable(LocalTransport):
    """Nothing reaches the head: every helper call fails as SSH would."""

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        raise TransportError(f"cannot reach {node.name} (root@127.0.0.2:22): refused")


async def test_a_head_we_cannot_reach_is_named_as_unreachable_and_never_waited_for(
    tmp_path: Path, inventory: Inventory
) -> None:
    a = locks(inventory, HeadUnreachable(), "replica-a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    refused = await a.acquire(MODEL, "remediator", "5", renew=False, wait=30.0)
    assert isinstance(refused, LockRefused), refused
    assert loop.time() - started < 5  # the wait is for a holder, not for a dead node
    assert (refused.kind, refused.node) == ("unreachable", "ai001")
    assert refused.why.startswith("cannot reach the lock on ai001: cannot reach ai001")


class HeadAnswers(LocalTransport):
    """The head answers every helper call with one fixed result."""

    def __init__(self, result: CommandResult):
        self.result = result

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        return self.result


@pytest.mark.parametrize("status", [1, 2])
async def test_a_head_whose_lock_helper_fails_is_a_refusal_in_its_words_not_unreachable(
    inventory: Inventory, status: int
) -> None:
    failed = CommandResult(status, "", "mlx-medic node lock: cannot read the inventory\n")
    a = locks(inventory, HeadAnswers(failed), "replica-a")
    refused = await a.acquire(MODEL, "remediator", "5", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert refused.kind == "helper_failed"  # it answered: reachable
    assert refused.why.startswith("the lock helper failed on ai001: ")
    assert f"exit {status}" in refused.why
    assert "cannot read the inventory" in refused.why


async def test_a_head_whose_helper_cannot_read_its_inventory_is_misconfigured_at_once(
    inventory: Inventory,
) -> None:
    """Not `locked` and no wait: no holder will let go of a missing inventory."""
    config = inventory.node("ai001").medic_config
    unreadable = CommandResult(
        2, "", f"mlx-medic node lock: {config}: cannot read: No such file or directory\n"
    )
    a = locks(inventory, HeadAnswers(unreadable), "replica-a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    refused = await a.acquire(MODEL, "remediator", "5", renew=False, wait=30.0)
    assert loop.time() - started < 5
    assert isinstance(refused, LockRefused), refused
    assert (refused.kind, refused.node) == ("misconfigured", "ai001")
    assert refused.misconfiguration is not None
    assert (refused.misconfiguration.kind, refused.misconfiguration.path) == (
        "config-unreadable",
        str(config),
    )
    assert refused.why == str(refused.misconfiguration)


async def test_a_head_that_does_not_answer_in_time_is_unreachable(inventory: Inventory) -> None:
    a = locks(inventory, HeadAnswers(CommandResult(None, "", "", timed_out=True)), "replica-a")
    refused = await a.acquire(MODEL, "remediator", "5", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert (refused.kind, refused.node) == ("unreachable", "ai001")
    assert refused.why.startswith("cannot reach the lock on ai001: ")
    assert "no answer within" in refused.why


async def test_a_live_holder_is_held_and_not_unreachable(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    plant(tmp_path, inventory, host="replica-b", pid=os.getpid(), expires=2e9)
    a = locks(inventory, transport, "replica-a")
    refused = await a.acquire(MODEL, "remediator", "5", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert refused.kind == "locked" and "locked by remediator" in refused.why


async def test_acquire_waits_a_bounded_time_for_a_holder_that_lets_go(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    """The serve wrapper holds the lock while its ranks start, then releases it."""
    serve = locks(inventory, transport, "head", this_node="ai001")
    held = await serve.acquire(MODEL, "serve", "r1", renew=False)
    assert isinstance(held, LockHandle)
    remediator = locks(inventory, transport, "replica-a")

    async def ranks_up() -> None:
        await asyncio.sleep(1.0)
        await serve.release(held)

    releasing = asyncio.create_task(ranks_up())
    handle = await remediator.acquire(MODEL, "remediator", "7", renew=False, wait=20.0)
    await releasing
    assert isinstance(handle, LockHandle) and handle.info.run_id == "7"
    assert 1.0 <= handle.waited < 15.0  # well within its 20 s: it took the lock once free


async def test_acquire_gives_up_after_its_wait_while_the_holder_keeps_the_lock(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    plant(
        tmp_path,
        inventory,
        host="head",
        node="ai001",
        holder="serve",
        pid=os.getpid(),
        pid_start=started_at(os.getpid()),
        expires=0.0,
    )
    a = locks(inventory, transport, "replica-a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    refused = await a.acquire(MODEL, "remediator", "8", renew=False, wait=1.5)
    assert isinstance(refused, LockRefused), refused
    assert 1.5 <= loop.time() - started < 5.0
    assert "locked by serve" in refused.why and refused.kind == "locked"
    handle = await a.acquire(MODEL, "remediator", "8", renew=False)  # no wait: one try
    assert isinstance(handle, LockRefused)


async def test_a_holder_on_a_node_the_inventory_no_longer_lists_is_judged_by_its_lease(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    clock = Clock(1000.0)
    plant(tmp_path, inventory, node="ai099", pid=os.getpid(), expires=1100.0)
    a = locks(inventory, transport, "replica-a", clock)
    refused = await a.acquire(MODEL, "remediator", "5", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert "ai099 is not in the inventory" in refused.why
    clock.now = 1101.0
    assert isinstance(await a.acquire(MODEL, "remediator", "5", renew=False), LockHandle)


async def test_the_lock_records_the_holders_node_pid_and_start(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "ai002-host", this_node="ai002")
    handle = await a.acquire(MODEL, "serve", "r1", renew=False)
    assert isinstance(handle, LockHandle)
    info = LockInfo.parse(lock_file(tmp_path, inventory).read_text())
    assert (info.node, info.pid) == ("ai002", os.getpid())
    assert info.pid_start == pytest.approx(started_at(os.getpid()), abs=0.01)


def test_a_node_the_inventory_does_not_list_is_refused(
    inventory: Inventory, transport: LocalTransport
) -> None:
    with pytest.raises(ValueError, match="'ai042' is not in the inventory"):
        locks(inventory, transport, "h", this_node="ai042")


async def test_a_holder_elsewhere_is_judged_by_its_lease(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    clock = Clock(1000.0)
    b = locks(inventory, transport, "replica-b", clock)
    plant(tmp_path, inventory, host="replica-a", pid=os.getpid(), expires=1100.0)
    assert isinstance(await b.acquire(MODEL, "remediator", "7", renew=False), LockRefused)
    clock.now = 1101.0
    handle = await b.acquire(MODEL, "remediator", "7", renew=False)
    assert isinstance(handle, LockHandle) and handle.info.host == "replica-b"


async def test_a_holder_on_the_head_node_is_judged_by_its_pid_there(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    # The serve wrapper on the head names its node; `ps -p` on the head decides
    # (LocalTransport runs it here, where these pids live).
    remote = locks(inventory, transport, "remediator-host")
    plant(
        tmp_path,
        inventory,
        host="head-host",
        node="ai001",
        holder="serve",
        pid=os.getpid(),
        expires=0.0,
    )
    refused = await remote.acquire(MODEL, "remediator", "8", renew=False)
    assert isinstance(refused, LockRefused), refused
    assert "locked by serve" in refused.why
    plant(
        tmp_path,
        inventory,
        host="head-host",
        node="ai001",
        holder="serve",
        pid=dead_pid(),
        expires=2e9,
    )
    assert isinstance(await remote.acquire(MODEL, "remediator", "8", renew=False), LockHandle)


async def test_an_unreadable_lock_file_counts_as_held(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    path = lock_file(tmp_path, inventory)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    a = locks(inventory, transport, "replica-a")
    refused = await a.acquire(MODEL, "remediator", "1")
    assert isinstance(refused, LockRefused), refused
    assert "unreadable lock file" in refused.why


async def test_renewal_extends_the_lease_while_the_lock_is_ours(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    clock = Clock(1000.0)
    a = locks(inventory, transport, "replica-a", clock, lease=60.0)
    handle = await a.acquire(MODEL, "remediator", "1", renew=False)
    assert isinstance(handle, LockHandle)
    clock.now = 1050.0
    assert await a.renew(handle)
    assert LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires == 1110.0
    await a.release(handle)
    assert not await a.renew(handle)


async def test_at_start_up_only_the_lock_an_ended_run_wrote_is_released(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = locks(inventory, transport, "replica-a")
    plant(tmp_path, inventory, host="replica-b", pid=4242, run_id="3", expires=2e9)
    assert await a.release_of_ended_run(MODEL, "3", "replica-a", 4242) is None  # another host's
    assert await a.release_of_ended_run(MODEL, "4", "replica-b", 4242) is None  # another run
    released = await a.release_of_ended_run(MODEL, "3", "replica-b", 4242)
    assert released is not None and released.pid == 4242
    assert not lock_file(tmp_path, inventory).exists()
    assert await a.release_of_ended_run(MODEL, "3", "replica-b", 4242) is None  # nothing left


async def test_a_holder_name_outside_the_known_set_is_refused(
    inventory: Inventory, transport: LocalTransport
) -> None:
    with pytest.raises(ValueError, match="holder must be one of"):
        await locks(inventory, transport, "a").acquire(MODEL, "cron", "1")


async def test_the_lease_is_renewed_in_the_background_while_the_lock_is_held(
    tmp_path: Path, inventory: Inventory, transport: LocalTransport
) -> None:
    a = ModelLocks(inventory, transport, this_node=None, hostname="replica-a", lease=3.0)
    handle = await a.acquire(MODEL, "remediator", "1")
    assert isinstance(handle, LockHandle) and handle.renewer is not None
    first = LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires
    for _ in range(200):  # renewed every second; each renewal is a helper run on the head
        await asyncio.sleep(0.1)
        if LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires > first:
            break
    assert LockInfo.parse(lock_file(tmp_path, inventory).read_text()).expires > first
    await a.release(handle)
    assert handle.renewer.done() and not lock_file(tmp_path, inventory).exists()


# --- real nodes: each its own PID namespace, one host name, real sshd ----------------


TINY = {
    "name": "tiny",
    "model": "/models/tiny",
    "nodes": ["ai001", "ai002"],
    "port": 18082,
    "service": {"manager": "supervisord", "label": "tiny"},
    "backends": {"ring": {"hostfile": "/etc/ring.json"}},
}


def holder_on(node, *, invisible_from: list) -> tuple[subprocess.Popen[bytes], int, int]:
    """A sleeping process on `node` whose pid (as `node` sees it) is no live process here
    nor on the nodes in `invisible_from`: judged from anywhere but its node, it would
    look dead. (popen, host pid, pid inside the node)"""
    extra: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(500):
            sleeper = node.spawn(["sleep", "300"])
            host_pid = node.spawned_pid(sleeper)
            ns_pid = node.ns_pid_of(host_pid)
            elsewhere = {
                pid for other in invisible_from for pid in map(other.ns_pid_of, other.host_pids())
            }
            if not psutil.pid_exists(ns_pid) and ns_pid not in elsewhere:
                return sleeper, host_pid, ns_pid
            extra.append(sleeper)
        raise AssertionError(f"no pid on {node.name} is free here after 500 tries")
    finally:
        for popen in extra:
            popen.kill()
            popen.wait(timeout=10)


def write_lock(path: Path, **fields) -> None:
    info = {
        "host": socket.gethostname(),
        "time": 0.0,
        "holder": "manual",
        "run_id": "r1",
        "expires": 0.0,
        **fields,
    }  # the lease ran out long ago: only the pid check holds it
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))


@pytest.mark.testbed
async def test_over_ssh_a_holder_is_judged_on_its_own_node_by_pid_and_start_time(
    clean_cluster,
) -> None:
    cluster = clean_cluster
    inventory = load_inventory(helper_inventory(cluster, [TINY], "lock"))
    head, peer = cluster.node("ai001"), cluster.node("ai002")
    ssh = SshTransport(inventory)
    # The judge runs here, with the same host name as the holder: that decides nothing.
    judge = ModelLocks(
        inventory, ssh, this_node=None, hostname=socket.gethostname(), clock=lambda: 2e9
    )
    lock = head.host_path(inventory.state_dir / "locks" / "tiny.lock")
    sleeper, host_pid, ns_pid = holder_on(peer, invisible_from=[head])
    try:
        # a holder on ai002 (not the head): alive there, invisible here and on the head
        write_lock(lock, node="ai002", pid=ns_pid, pid_start=started_at(host_pid))
        refused = await judge.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(refused, LockRefused), refused
        assert f"locked by manual (run r1, pid {ns_pid} on node ai002" in refused.why

        # the same pid with another start time: a reused pid, not the holder
        write_lock(lock, node="ai002", pid=ns_pid, pid_start=started_at(host_pid) - 3600)
        handle = await judge.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(handle, LockHandle), handle
        await judge.release(handle)

        # the holder dies on its node: stale
        write_lock(lock, node="ai002", pid=ns_pid, pid_start=started_at(host_pid))
        os.kill(host_pid, signal.SIGKILL)
        sleeper.wait(timeout=10)
        handle = await judge.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(handle, LockHandle), handle
        assert json.loads(lock.read_text())["node"] is None
        await judge.release(handle)
        assert not lock.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        await ssh.close()


@pytest.mark.testbed
async def test_over_ssh_a_holder_on_an_unreachable_node_counts_as_held(clean_cluster) -> None:
    cluster = clean_cluster
    path = helper_inventory(cluster, [TINY], "lock")
    inventory = parse_inventory(
        path.read_text().replace(cluster.node("ai003").address, "127.0.0.254")
    )
    ssh = SshTransport(inventory)
    lock = cluster.head.host_path(inventory.state_dir / "locks" / "tiny.lock")
    write_lock(lock, node="ai003", pid=dead_pid())
    try:
        judge = ModelLocks(inventory, ssh, this_node=None, clock=lambda: 2e9)
        refused = await judge.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(refused, LockRefused), refused
        assert "cannot check its pid on ai003" in refused.why
        assert lock.exists()
    finally:
        await ssh.close()


@pytest.mark.testbed
async def test_over_ssh_a_serve_wrapper_holder_on_the_head_is_judged_by_its_pid_there(
    clean_cluster,
) -> None:
    cluster = clean_cluster
    inventory = load_inventory(helper_inventory(cluster, [TINY], "lock"))
    ssh = SshTransport(inventory)
    head = cluster.node("ai001")
    sleeper = head.spawn(["sleep", "300"])
    try:
        host_pid = head.spawned_pid(sleeper)
        ns_pid = head.ns_pid_of(host_pid)
        serve = ModelLocks(
            inventory,
            LocalTransport(),
            this_node="ai001",
            hostname="head-host",
            pid=ns_pid,
            pid_start=started_at(host_pid),
        )
        assert lock_path(inventory.state_dir, "tiny") == inventory.state_dir / "locks" / "tiny.lock"
        lock = head.host_path(lock_path(inventory.state_dir, "tiny"))
        lock.parent.mkdir(parents=True, exist_ok=True)
        info = serve._info("serve", "run-1")
        lock.write_text(info.to_json())  # as the wrapper on the head wrote it, lease long over
        remote = ModelLocks(
            inventory, ssh, this_node=None, hostname="remediator-host", clock=lambda: 2e9
        )
        refused = await remote.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(refused, LockRefused), refused
        assert "locked by serve" in refused.why
        os.kill(host_pid, signal.SIGKILL)  # the wrapper dies; its pid is gone on the head
        sleeper.wait(timeout=10)
        handle = await remote.acquire("tiny", "remediator", "7", renew=False)
        assert isinstance(handle, LockHandle), handle
        assert json.loads(lock.read_text())["host"] == "remediator-host"
        await remote.release(handle)
        assert not lock.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        await ssh.close()


class NoHelpers(LocalTransport):
    """A transport that fails the test if a helper process is started."""

    async def run(self, node, argv, *, timeout):  # type: ignore[override]
        raise AssertionError(f"a helper was started: {argv}")


def test_the_serve_wrapper_takes_its_own_nodes_lock_in_process_as_the_helper_would(
    tmp_path: Path,
    inventory: Inventory,
):
    head = inventory.model(MODEL).head
    here = locks(inventory, NoHelpers(), "ai001", this_node=head, in_process=True)

    async def scenario() -> None:
        handle = await here.acquire(MODEL, "serve", "run-1", renew=False)
        assert isinstance(handle, LockHandle)
        assert json.loads(lock_file(tmp_path, inventory).read_text())["run_id"] == "run-1"
        other = locks(
            inventory, NoHelpers(), "ai001", this_node=head, in_process=True, pid=os.getpid()
        )
        refused = await other.acquire(MODEL, "serve", "run-2", renew=False)  # held
        assert isinstance(refused, LockRefused), refused
        assert "locked by" in refused.why
        await here.release(handle)
        assert not lock_file(tmp_path, inventory).exists()
        # A holder on this node whose pid is gone is stale, judged here without a helper.
        plant(tmp_path, inventory, node=head, pid=dead_pid(), expires=2e9)
        taken = await here.acquire(MODEL, "serve", "run-3", renew=False)
        assert isinstance(taken, LockHandle) and taken.info.run_id == "run-3"

    asyncio.run(scenario())
