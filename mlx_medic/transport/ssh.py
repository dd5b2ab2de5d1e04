"""The node transport over SSH (asyncssh): how the remediator acts on its nodes.

Every command is an argv list, joined with `shlex.quote`, so a value (a path, a
label) is always one word and never shell syntax. Only this module imports asyncssh:
the exporter and `mlx-medic probe` import the transport interface without paying for it.

Helper calls go through one helper session per node (mlx_medic.transport.helper_session)
while `ssh.helper_sessions` is on (the default): the node forks a child per call instead
of starting a process. A node that does not open one (an older mlx-medic, a forced
command without the grant) gets a process per call, said once, and is asked again
after SESSION_RETRY_AFTER.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time

import asyncssh

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.transport.helper_session import (
    HelperSession,
    SessionRetry,
    SessionUnavailable,
    session_argv,
    through_a_session,
)
from mlx_medic.transport.interface import CommandResult, TransportError, output_text
from mlx_medic.transport.ssh_options import asyncssh_options

log = logging.getLogger(__name__)
SESSION_RETRY_AFTER = 300.0  # seconds before a node that opened no session is asked again


class SshTransport:
    """asyncssh, one reused connection per node, connected as `asyncssh_options` says
    (host keys always checked, ~/.ssh/config not read)."""

    def __init__(self, inventory: Inventory, *, helper_sessions: bool | None = None):
        """`helper_sessions`: None, as the inventory's `ssh.helper_sessions` says; False for
        a caller of one helper call per node, for which opening a session costs more
        than the call."""
        self.inventory = inventory
        self._connections: dict[str, asyncssh.SSHClientConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self.helper_sessions = (
            inventory.ssh.helper_sessions if helper_sessions is None else helper_sessions
        )
        self._sessions: dict[str, HelperSession] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._no_session: dict[str, float] = {}  # node -> when it last opened none

    async def _connection(self, node: Node) -> asyncssh.SSHClientConnection:
        lock = self._connecting.setdefault(node.name, asyncio.Lock())
        async with lock:
            conn = self._connections.get(node.name)
            if conn is not None and not conn.is_closed():
                return conn
            options = asyncssh_options(node, self.inventory.ssh)
            try:
                conn = await asyncssh.connect(**options)
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                raise TransportError(
                    f"cannot reach {node.name} ({node.user}@{node.ssh}:{node.port}): {exc}"
                ) from exc
            self._connections[node.name] = conn
            return conn

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if not argv:
            raise ValueError("an empty command has no meaning")
        if self.helper_sessions and through_a_session(node, argv):
            for _attempt in (1, 2):
                session = await self._session(node, timeout)
                if session is None:
                    break
                try:
                    return await session.run(argv, timeout)
                except SessionRetry:  # not run: a new session runs it
                    self._drop_session(node, session)
        return await self._run_process(node, argv, timeout)

    async def _session(self, node: Node, timeout: float) -> HelperSession | None:
        """The node's open session, opened if need be; None: run a process per call."""
        lock = self._opening.setdefault(node.name, asyncio.Lock())
        async with lock:
            session = self._sessions.get(node.name)
            if session is not None and session.ended is None:
                return session
            refused_at = self._no_session.get(node.name)
            if refused_at is not None and time.monotonic() - refused_at < SESSION_RETRY_AFTER:
                return None
            process = await self._open_session_process(node)
            session = HelperSession(
                node.name, process.stdin, process.stdout, process.stderr, process.close
            )
            try:
                await session.start(timeout)
            except SessionUnavailable as exc:
                self._no_session[node.name] = time.monotonic()
                log.warning(
                    "%s: no helper session (%s): each helper call starts its own process",
                    node.name,
                    exc,
                )
                return None
            self._no_session.pop(node.name, None)
            self._sessions[node.name] = session
            return session

    async def _open_session_process(self, node: Node) -> asyncssh.SSHClientProcess[bytes]:
        for attempt in (1, 2):
            conn = await self._connection(node)
            try:
                return await conn.create_process(shlex.join(session_argv(node)), encoding=None)
            except asyncssh.ChannelOpenError as exc:
                # The reused connection died before the session started: safe to retry once.
                self._drop(node, conn)
                if attempt == 2:
                    raise TransportError(f"{node.name}: {exc}") from exc
            except (OSError, asyncssh.Error) as exc:
                self._drop(node, conn)
                raise TransportError(f"{node.name}: cannot open a helper session: {exc}") from exc
        raise AssertionError("unreachable")

    def _drop_session(self, node: Node, session: HelperSession) -> None:
        if self._sessions.get(node.name) is session:
            del self._sessions[node.name]
        session.close()

    async def _run_process(self, node: Node, argv: list[str], timeout: float) -> CommandResult:
        """The command as a process of its own on the node."""
        command = shlex.join(argv)
        for attempt in (1, 2):
            conn = await self._connection(node)
            try:
                result = await conn.run(command, check=False, timeout=timeout)
            except asyncssh.TimeoutError as exc:
                return CommandResult(
                    None, output_text(exc.stdout), output_text(exc.stderr), timed_out=True
                )
            except asyncssh.ChannelOpenError as exc:
                # The reused connection died before the command started: safe to retry once.
                self._drop(node, conn)
                if attempt == 1:
                    continue
                raise TransportError(f"{node.name}: {exc}") from exc
            except (OSError, asyncssh.Error) as exc:
                self._drop(node, conn)
                raise TransportError(f"{node.name}: {shlex.join(argv[:3])}...: {exc}") from exc
            return CommandResult(
                result.exit_status, output_text(result.stdout), output_text(result.stderr)
            )
        raise AssertionError("unreachable")

    def _drop(self, node: Node, conn: asyncssh.SSHClientConnection) -> None:
        if self._connections.get(node.name) is conn:
            del self._connections[node.name]
        conn.close()

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            session.close()
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
        for conn in connections.values():
            with contextlib.suppress(Exception):
                await conn.wait_closed()
