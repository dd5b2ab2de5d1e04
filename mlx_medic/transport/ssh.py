"""The node transport over SSH (asyncssh): how the remediator acts on its nodes.

Every command is an argv list, joined with `shlex.quote`, so a value (a path, a
label) is always one word and never shell syntax. Only this module imports asyncssh:
the exporter and `mlx-medic probe` import the transport interface without paying for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex

import asyncssh

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.transport.interface import CommandResult, TransportError, output_text
from mlx_medic.transport.ssh_options import asyncssh_options

log = logging.getLogger(__name__)


class SshTransport:
    """asyncssh, one reused connection per node, connected as `asyncssh_options` says
    (host keys always checked, ~/.ssh/config not read)."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self._connections: dict[str, asyncssh.SSHClientConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

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
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
        for conn in connections.values():
            with contextlib.suppress(Exception):
                await conn.wait_closed()
