"""The per-model lock: one file on the model's HEAD node, created atomically.

Every touch of it is a node helper on the head (`mlx-medic node lock MODEL
take|show|replace|release|break`, each one compare-then-write under an flock there), and
every liveness question a helper on the holder's node (`mlx-medic node pid-alive`), so
over SSH the lock needs nothing but `mlx-medic node ...` (a forced command can pin the
key to that).

Why there: the lock must exclude everyone who acts on the model (two remediator
replicas, an on-call `mlx-medic remediate`, the serve wrapper's pre-start sweep)
and must outlive any one process. The head node is the one place they all reach.

The file holds JSON {node, pid, pid_start, host, time, holder, run_id, expires, token}.
It is stale when its holder is dead, and who may say so depends on who the holder is:
- a holder that names its inventory node (`node`: the serve wrapper, a node helper,
  anyone given its node identity): its pid is looked up ON THAT NODE through the
  transport (`pid-alive` there); gone, a zombie, or a pid now owned by a
  process started at another time (reused) is stale at once, alive is held whatever
  its lease. Never judged from a host name and a pid seen here: the testbed's nodes
  share one host name, and a pid means something only in its own PID namespace.
- a holder with no node identity (a remediator off the cluster): its lease
  (`expires`, renewed while the lock is held) alone.
`host` is there for people reading the lock; it decides nothing. `token` is the
acquirer's nonce: release and renew touch only the lock this acquire wrote.
Anything we cannot judge (node unreachable, unreadable file, a helper that answered with
an error) counts as held: fail closed. `acquire` returns the lock or a `LockRefused` that
says why and of which kind: `locked` (someone holds it, or we cannot tell who),
`unreachable` (naming the node that did not answer: cannot connect, no answer in time),
`misconfigured` (a node's mlx-medic cannot serve the call as deployed: its inventory
unreadable, mlx-medic missing, its forced command refusing, another version; what and the
fix in `misconfiguration`, no waiting) or `helper_failed` (the head's lock helper answered
with an error, its message in `why`), so a caller can tell "someone holds it" from "we
cannot reach it" from "it is deployed wrong". A caller may wait a
bounded time for a held lock (`acquire(wait=...)`): the serve wrapper holds it while its
ranks start.
This module knows nothing of the remediator, so the serve wrapper on the head can use
it too, with a RoutedTransport (its own node local, peers over SSH: a holder on a peer
must be asked about there, not here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.node.client import ANY_CALLER, HelperCallError, HelperMisconfigured, NodeHelpers
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.node.replies import PidAliveReply
from mlx_medic.processes.pid_liveness import Liveness, local_liveness
from mlx_medic.state.model_lock_file import (
    LockInfo,
    LockState,
    act_and_read,
    lock_path,
    text_digest,
)
from mlx_medic.transport.interface import NodeTransport, TransportError

log = logging.getLogger(__name__)

Holder = Literal["remediator", "manual", "serve"]
HOLDERS = ("remediator", "manual", "serve")
HELPER_TIMEOUT = 30.0  # one lock or pid-alive helper on a node
WAIT_POLL = 2.0  # seconds between attempts while waiting for a held lock


class LockHelperFailed(TransportError):
    """The head answered, but its `lock` helper failed (an exit without a helper document,
    ended by a signal); the message is the head's. A TransportError still, so whoever
    fails closed on an unreachable head does so on this too; only acquire tells them apart
    (the head is not unreachable)."""


class LockMisconfigured(LockHelperFailed):
    """A node the lock needed (the head, or the holder's node) answered, but its mlx-medic
    cannot serve the call as deployed: `misconfiguration` says what and the fix."""

    def __init__(self, misconfiguration: Misconfiguration):
        super().__init__(str(misconfiguration))
        self.misconfiguration = misconfiguration


RefusalKind = Literal["locked", "unreachable", "misconfigured", "helper_failed"]


@dataclass(frozen=True)
class LockRefused:
    """Why `acquire` did not take the lock. `kind`: `locked` (held, or its holder cannot be
    judged: fail closed), `unreachable` (`node` gave no answer: the head, or the holder's
    node asked whether its pid lives), `misconfigured` (`node`'s mlx-medic is deployed
    wrong for the call: `misconfiguration`) or `helper_failed` (the `lock` helper on
    `node`, the head, answered with an error). `why` is the sentence the journal and the
    person see."""

    why: str
    kind: RefusalKind
    node: str
    misconfiguration: Misconfiguration | None = None


@dataclass
class LockHandle:
    model: str
    node: Node
    info: LockInfo
    renewer: asyncio.Task[None] | None = field(default=None, repr=False)
    waited: float = 0.0  # seconds spent waiting for another holder to let go


def process_start_time(pid: int) -> float | None:
    """When a process of this machine started (Unix time), or None if we cannot tell."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


class ModelLocks:
    """Acquire and release model locks on head nodes over a NodeTransport."""

    def __init__(
        self,
        inventory: Inventory,
        transport: NodeTransport,
        *,
        this_node: str | None,
        hostname: str | None = None,
        pid: int | None = None,
        pid_start: float | None = None,
        lease: float = 90.0,
        clock: Callable[[], float] = time.time,
        in_process: bool = False,
        caller: str = ANY_CALLER,
    ):
        """`this_node`: the inventory node this process runs on (from node identity:
        `--node` or `<state_dir>/node-id`), or None off the cluster. `pid` and
        `pid_start` default to this process's. `in_process`: this process acts on the
        locks of its own node itself, as the `lock` and `pid-alive` helpers would (the
        serve wrapper on its head: no helper process to start on a crash's path).
        `caller`: who calls the helpers, as a version mismatch names it."""
        if this_node is not None and this_node not in {n.name for n in inventory.nodes}:
            known = ", ".join(n.name for n in inventory.nodes)
            raise ValueError(f"this node {this_node!r} is not in the inventory (nodes: {known})")
        self.inventory = inventory
        self.transport = transport
        self.this_node = this_node
        self.hostname = hostname or socket.gethostname()
        self.pid = pid if pid is not None else os.getpid()
        self.pid_start = pid_start if pid_start is not None else process_start_time(self.pid)
        self.lease = lease
        self.clock = clock
        self.in_process = in_process
        self.helpers = NodeHelpers(transport, inventory, timeout=HELPER_TIMEOUT, caller=caller)

    def _head(self, model: str) -> Node:
        return self.inventory.node(self.inventory.model(model).head)

    def _info(self, holder: str, run_id: str) -> LockInfo:
        now = self.clock()
        return LockInfo(
            node=self.this_node,
            pid=self.pid,
            pid_start=self.pid_start,
            host=self.hostname,
            time=now,
            holder=holder,
            run_id=run_id,
            expires=now + self.lease,
            token=secrets.token_hex(8),
        )

    async def acquire(
        self, model: str, holder: str, run_id: str, *, renew: bool = True, wait: float = 0.0
    ) -> LockHandle | LockRefused:
        """The lock, or why not: someone live held it for all of `wait` seconds, its helper
        failed, or a node did not answer or is misconfigured (no waiting then)."""
        if holder not in HOLDERS:
            raise ValueError(f"lock holder must be one of {HOLDERS}, not {holder!r}")
        started = time.monotonic()
        waited = 0.0
        while True:
            taken = await self._try_acquire(model, holder, run_id, renew=renew)
            if isinstance(taken, LockHandle):
                taken.waited = waited
                return taken
            waited = time.monotonic() - started
            if taken.kind in ("unreachable", "misconfigured") or waited >= wait:
                return taken
            await asyncio.sleep(min(WAIT_POLL, wait - waited))
            waited = time.monotonic() - started

    async def _lock(self, head: Node, model: str, action: str, *args: str) -> LockState:
        """The head's `lock` helper's answer (its action done or not); TransportError when
        the head gave no answer (unreachable, timed out), LockMisconfigured when its
        mlx-medic cannot serve the call as deployed, LockHelperFailed when it answered
        without a lock helper's document (the helper failed: exit 1 or 2, its stderr the
        message)."""
        if self.in_process and head.name == self.this_node:
            return await asyncio.to_thread(self._lock_here, model, action, args)
        try:
            reply = await self.helpers.call(head.name, "lock", model, action, *args)
        except HelperMisconfigured as exc:
            raise LockMisconfigured(exc.misconfiguration) from exc
        except HelperCallError as exc:
            if not exc.no_answer:
                raise LockHelperFailed(str(exc)) from exc
            cause = exc.__cause__ if exc.unreachable else None  # the transport's own words
            raise TransportError(str(cause or exc)) from exc
        try:
            return LockState.from_document(reply.document)
        except ValueError as exc:
            raise LockHelperFailed(f"{head.name}: mlx-medic node lock: {exc}") from exc

    def _lock_here(self, model: str, action: str, args: tuple[str, ...]) -> LockState:
        """The `lock` helper's action and answer, done by this process on its own node."""
        from mlx_medic.state.files import StateFileError

        options = dict(zip(args[::2], args[1::2], strict=True))
        path = lock_path(self.inventory.state_dir, model)
        try:
            return act_and_read(
                path,
                action,
                info=options.get("--info"),
                token=options.get("--token"),
                expected_token=options.get("--expected-token"),
                expected_sha256=options.get("--expected-sha256"),
            )
        except (StateFileError, ValueError) as exc:
            raise LockHelperFailed(f"{self.this_node}: the model lock: {exc}") from exc

    async def _try_acquire(
        self, model: str, holder: str, run_id: str, *, renew: bool
    ) -> LockHandle | LockRefused:
        head = self._head(model)

        def refused(why: str, kind: RefusalKind = "locked", node: str = head.name) -> LockRefused:
            return LockRefused(why, kind, node)

        for _attempt in range(2):
            info = self._info(holder, run_id)
            doing = "reach"  # the lock, then "judge" its holder
            try:
                taken = await self._lock(head, model, "take", "--info", info.to_json())
                if taken.done:
                    handle = LockHandle(model, head, info)
                    if renew and self.lease > 0:
                        handle.renewer = asyncio.create_task(self._renew_loop(handle))
                    return handle
                if taken.text is None:
                    continue  # released between our create and read: try again
                doing = "judge"
                stale, why, silent = await self._judge(head, taken.text)
                if not stale:
                    if silent is not None:
                        return refused(why, "unreachable", silent)
                    return refused(why)
                log.warning("breaking stale lock: %s", why, extra={"model": model})
                broken = await self._break(head, model, taken.text)
            except LockMisconfigured as exc:
                found = exc.misconfiguration
                return LockRefused(str(found), "misconfigured", found.node, found)
            except LockHelperFailed as exc:
                return refused(f"the lock helper failed on {head.name}: {exc}", "helper_failed")
            except TransportError as exc:
                return refused(f"cannot {doing} the lock on {head.name}: {exc}", "unreachable")
            if not broken:
                return refused("another process is breaking the same stale lock")
        return refused("the lock changed hands while we tried to take it")

    async def _text(self, model: str) -> str | None:
        return (await self._lock(self._head(model), model, "show")).text

    async def current(self, model: str) -> LockInfo | None:
        text = await self._text(model)
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
        if not handle.info.token:
            return
        released = await self._lock(
            handle.node, handle.model, "release", "--token", handle.info.token
        )
        if not released.done:
            log.warning("lock no longer ours; left in place", extra={"model": handle.model})

    async def renew(self, handle: LockHandle) -> bool:
        """Extend the lease; False if the lock is no longer ours."""
        if not handle.info.token:
            return False
        info = LockInfo(**{**asdict(handle.info), "expires": self.clock() + self.lease})
        replaced = await self._lock(
            handle.node,
            handle.model,
            "replace",
            "--expected-token",
            handle.info.token,
            "--info",
            info.to_json(),
        )
        if not replaced.done:
            return False
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

    async def release_of_ended_run(
        self, model: str, run_id: str, host: str, pid: int
    ) -> LockInfo | None:
        """Remove the lock a run left behind when the caller knows that run has ended
        (the remediator's journal found it in flight, its process gone). Only the lock
        exactly that run wrote (run id, host and pid as written), never another's.
        Returns it, or None when the lock is not that run's."""
        text = await self._text(model)
        if text is None:
            return None
        try:
            info = LockInfo.parse(text)
        except (ValueError, KeyError, TypeError):
            return None
        if (info.run_id, info.host, info.pid) != (run_id, host, pid):
            return None
        if await self._break(self._head(model), model, text):
            return info
        return None

    async def _judge(self, head: Node, text: str) -> tuple[bool, str, str | None]:
        """(stale?, a sentence saying who holds it or why it is stale, the holder's node
        when it did not answer the question); LockMisconfigured when the holder's node
        cannot be asked as deployed."""
        try:
            info = LockInfo.parse(text)
        except (ValueError, KeyError, TypeError) as exc:
            return (
                False,
                f"an unreadable lock file on {head.name} ({exc}); remove it by hand",
                None,
            )
        held = f"locked by {info.describe()}"
        if info.node is None:
            if info.expires < self.clock():
                return True, f"holder's lease on {info.host} ran out", None
            return False, held, None
        try:
            node = self.inventory.node(info.node)
        except KeyError:
            # Nobody can ask a node the inventory no longer lists: the lease decides.
            if info.expires < self.clock():
                return (
                    True,
                    f"holder's node {info.node} is not in the inventory; its lease ran out",
                    None,
                )
            return False, held + f"; its node {info.node} is not in the inventory", None
        if info.pid <= 0:
            return False, held + f"; pid {info.pid} is no process to ask about", None
        start = [] if info.pid_start is None else ["--start-time", repr(info.pid_start)]
        try:
            if self.in_process and node.name == self.this_node:
                liveness, why = await asyncio.to_thread(local_liveness, info.pid, info.pid_start)
            else:
                reply = await self.helpers.call(node.name, PidAliveReply, str(info.pid), *start)
                liveness, why = reply.answer.liveness, reply.answer.why
        except HelperMisconfigured as exc:  # no verdict: fail closed, naming the fix
            raise LockMisconfigured(exc.misconfiguration) from exc
        except HelperCallError as exc:
            silent = node.name if exc.no_answer else None
            return False, held + f"; cannot check its pid on {node.name}: {exc}", silent
        if liveness in (Liveness.DEAD, Liveness.REUSED):
            return True, f"holder pid {info.pid} on {node.name} is gone: {why}", None
        if liveness is Liveness.UNKNOWN:
            return (
                False,
                held + f"; cannot tell whether its pid lives on {node.name}: {why}",
                None,
            )
        return False, held, None

    async def _break(self, head: Node, model: str, stale_text: str) -> bool:
        """Remove a stale lock, but only the one judged stale: the head removes it only
        while its text is still exactly that (compared under its flock)."""
        digest = text_digest(stale_text)
        broken = await self._lock(head, model, "break", "--expected-sha256", digest)
        return broken.done
