"""The per-model lock: one file on the model's HEAD node, created atomically.

Why there: the lock must exclude everyone who acts on the model (two remediator
replicas, an on-call `mlx-medic remediate`, the serve wrapper's pre-start sweep)
and must outlive any one process. The head node is the one place they all reach.

The file holds JSON {host, pid, time, holder, run_id, expires, node, pid_start}.
It is stale when its holder is dead:
- holder on this host: its pid is gone (or reused: start time differs): stale at once;
- holder on the head node itself: `ps -p PID` there says it is gone;
- holder elsewhere: its lease (`expires`, renewed while a run lasts) has run out.
Anything we cannot judge (node unreachable, unreadable file) counts as held:
fail closed. This module knows nothing of the remediator, so the serve wrapper
can use it with a LocalTransport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from mlx_medic.inventory import Inventory, Node
from mlx_medic.transport import NodeTransport, TransportError

log = logging.getLogger(__name__)

Holder = Literal["remediator", "manual", "serve"]
HOLDERS = ("remediator", "manual", "serve")
BREAK_GUARD_TIMEOUT = 60.0  # a breaker that held the guard longer than this crashed


@dataclass(frozen=True)
class LockInfo:
    host: str
    pid: int
    time: float
    holder: str
    run_id: str
    expires: float
    node: str | None = None  # the inventory node the holder runs on, when it knows
    pid_start: float | None = None  # the holder's process start time (pid reuse guard)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> LockInfo:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the lock file is not a JSON object")
        return cls(
            host=str(data["host"]),
            pid=int(data["pid"]),
            time=float(data["time"]),
            holder=str(data["holder"]),
            run_id=str(data["run_id"]),
            expires=float(data["expires"]),
            node=None if data.get("node") is None else str(data["node"]),
            pid_start=None if data.get("pid_start") is None else float(data["pid_start"]),
        )

    def describe(self) -> str:
        return (
            f"{self.holder} (run {self.run_id}, pid {self.pid} on {self.host},"
            f" since {time.strftime('%H:%M:%SZ', time.gmtime(self.time))})"
        )


@dataclass
class LockHandle:
    model: str
    node: Node
    path: Path
    info: LockInfo
    renewer: asyncio.Task[None] | None = field(default=None, repr=False)


def process_start_time(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


def local_pid_alive(pid: int, pid_start: float | None = None) -> bool:
    """Alive and, when its start time was recorded, the same process (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if pid_start is not None:
        started = process_start_time(pid)
        if started is not None and abs(started - pid_start) > 1.0:
            return False
    return True


class ModelLocks:
    """Acquire and release model locks on head nodes over a NodeTransport."""

    def __init__(
        self,
        inventory: Inventory,
        transport: NodeTransport,
        *,
        hostname: str | None = None,
        pid: int | None = None,
        node_name: str | None = None,
        lease: float = 90.0,
        clock: Callable[[], float] = time.time,
    ):
        self.inventory = inventory
        self.transport = transport
        self.hostname = hostname or socket.gethostname()
        self.pid = pid if pid is not None else os.getpid()
        self.node_name = node_name
        self.lease = lease
        self.clock = clock
        self.refusals: dict[str, str] = {}  # model -> why the last acquire failed
        self._head_hostnames: dict[str, str] = {}
        self._pid_start = process_start_time(self.pid)

    def path_for(self, model: str) -> Path:
        self.inventory.model(model)  # a KeyError names an unknown model
        return self.inventory.state_dir / "locks" / f"{model}.lock"

    def _head(self, model: str) -> Node:
        return self.inventory.node(self.inventory.model(model).head)

    def _info(self, holder: str, run_id: str) -> LockInfo:
        now = self.clock()
        return LockInfo(
            host=self.hostname,
            pid=self.pid,
            time=now,
            holder=holder,
            run_id=run_id,
            expires=now + self.lease,
            node=self.node_name,
            pid_start=self._pid_start,
        )

    async def acquire(
        self, model: str, holder: str, run_id: str, *, renew: bool = True
    ) -> LockHandle | None:
        """The lock, or None if someone live holds it (`refusals[model]` says who)."""
        if holder not in HOLDERS:
            raise ValueError(f"lock holder must be one of {HOLDERS}, not {holder!r}")
        head, path = self._head(model), self.path_for(model)
        for _attempt in range(2):
            info = self._info(holder, run_id)
            try:
                if await self.transport.create_exclusive(head, path, info.to_json()):
                    handle = LockHandle(model, head, path, info)
                    if renew and self.lease > 0:
                        handle.renewer = asyncio.create_task(self._renew_loop(handle))
                    self.refusals.pop(model, None)
                    return handle
                text = await self.transport.read_text(head, path)
            except TransportError as exc:
                self.refusals[model] = f"cannot reach the lock on {head.name}: {exc}"
                return None
            if text is None:
                continue  # released between our create and read: try again
            try:
                stale, why = await self._judge(head, text)
                if not stale:
                    self.refusals[model] = why
                    return None
                log.warning("breaking stale lock: %s", why, extra={"model": model})
                broken = await self._break(head, path, text)
            except TransportError as exc:
                self.refusals[model] = f"cannot judge the lock on {head.name}: {exc}"
                return None
            if not broken:
                self.refusals[model] = "another process is breaking the same stale lock"
                return None
        self.refusals[model] = "the lock changed hands while we tried to take it"
        return None

    async def current(self, model: str) -> LockInfo | None:
        text = await self.transport.read_text(self._head(model), self.path_for(model))
        if text is None:
            return None
        try:
            return LockInfo.parse(text)
        except (ValueError, KeyError, TypeError):
            return None

    async def release(self, handle: LockHandle) -> None:
        """Remove the lock if it is still ours (never someone else's)."""
        if handle.renewer is not None:
            handle.renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handle.renewer
        text = await self.transport.read_text(handle.node, handle.path)
        if text is None:
            return
        if self._is_ours(text, handle.info):
            await self.transport.remove(handle.node, handle.path)
        else:
            log.warning("lock no longer ours; left in place", extra={"model": handle.model})

    async def renew(self, handle: LockHandle) -> bool:
        """Extend the lease; False if the lock is no longer ours."""
        text = await self.transport.read_text(handle.node, handle.path)
        if text is None or not self._is_ours(text, handle.info):
            return False
        now = self.clock()
        info = LockInfo(**{**asdict(handle.info), "expires": now + self.lease})
        await self.transport.replace_text(handle.node, handle.path, info.to_json())
        handle.info = info
        return True

    async def _renew_loop(self, handle: LockHandle) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.lease / 3))
            try:
                if not await self.renew(handle):
                    log.error("lost the model lock", extra={"model": handle.model})
                    return
            except TransportError as exc:
                log.warning("lock renewal failed: %s", exc, extra={"model": handle.model})

    async def release_stale_of_this_host(self, model: str) -> LockInfo | None:
        """At start-up: remove the lock a dead process of this host left. Returns it."""
        head, path = self._head(model), self.path_for(model)
        text = await self.transport.read_text(head, path)
        if text is None:
            return None
        try:
            info = LockInfo.parse(text)
        except (ValueError, KeyError, TypeError):
            return None
        if info.host != self.hostname or local_pid_alive(info.pid, info.pid_start):
            return None
        if await self._break(head, path, text):
            return info
        return None

    @staticmethod
    def _is_ours(text: str, mine: LockInfo) -> bool:
        try:
            info = LockInfo.parse(text)
        except (ValueError, KeyError, TypeError):
            return False
        return (info.host, info.pid, info.run_id) == (mine.host, mine.pid, mine.run_id)

    async def _head_hostname(self, head: Node) -> str | None:
        if head.name not in self._head_hostnames:
            try:
                result = await self.transport.run(head, ["uname", "-n"], timeout=10.0)
            except TransportError:
                return None
            if not result.ok:
                return None
            self._head_hostnames[head.name] = result.stdout.strip()
        return self._head_hostnames[head.name]

    async def _judge(self, head: Node, text: str) -> tuple[bool, str]:
        """(stale?, a sentence saying who holds it or why it is stale)."""
        try:
            info = LockInfo.parse(text)
        except (ValueError, KeyError, TypeError) as exc:
            return False, f"an unreadable lock file on {head.name} ({exc}); remove it by hand"
        held = f"locked by {info.describe()}"
        if info.host == self.hostname:
            if local_pid_alive(info.pid, info.pid_start):
                return False, held
            return True, f"holder pid {info.pid} on this host is dead"
        if info.node == head.name or info.host == await self._head_hostname(head):
            try:
                result = await self.transport.run(
                    head, ["ps", "-p", str(info.pid), "-o", "pid="], timeout=10.0
                )
            except TransportError:
                return False, held + "; cannot check its pid on the head node"
            if result.exit_status == 1 and not result.stdout.strip():
                return True, f"holder pid {info.pid} on head {head.name} is dead"
            return False, held
        if info.expires < self.clock():
            return True, f"holder's lease on {info.host} ran out"
        return False, held

    async def _break(self, head: Node, path: Path, stale_text: str) -> bool:
        """Remove a stale lock, but only the one judged stale: breakers take a guard
        file first, so two of them cannot remove each other's fresh lock."""
        guard = path.with_name(path.name + ".break")
        mine = json.dumps({"host": self.hostname, "pid": self.pid, "time": self.clock()})
        if not await self.transport.create_exclusive(head, guard, mine):
            text = await self.transport.read_text(head, guard)
            try:
                since = float(json.loads(text or "{}").get("time", 0.0))
            except (ValueError, AttributeError):
                since = 0.0
            if self.clock() - since > BREAK_GUARD_TIMEOUT:
                await self.transport.remove(head, guard)  # its breaker died
            return False
        try:
            if await self.transport.read_text(head, path) != stale_text:
                return False
            await self.transport.remove(head, path)
            return True
        finally:
            await self.transport.remove(head, guard)
