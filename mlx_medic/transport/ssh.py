"""The node transport over SSH (asyncssh): how the remediator acts on its nodes.

Every command is an argv list, joined with `shlex.quote`, so a value (a path, a
label) is always one word and never shell syntax. File operations are small fixed
`sh -c` scripts that take their paths as positional arguments (`"$1"`), never
spliced into the script text. Only this module imports asyncssh: the exporter and
`mlx-medic probe` import the transport interface without paying for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shlex
from pathlib import Path
from typing import Any

import asyncssh

from mlx_medic.inventory import Inventory, Node
from mlx_medic.transport.interface import CommandResult, TransportError, output_text

log = logging.getLogger(__name__)


# Fixed scripts; paths arrive as "$1", "$2". Exit codes: 0 done, 1 exists, 3 missing.
# Link-then-unlink makes the create atomic *and* complete: the lock file appears
# with its content or not at all (ln fails if the target exists).
_CREATE_EXCLUSIVE = (
    'umask 022; mkdir -p -- "$(dirname -- "$1")" || exit 2; '
    'tmp="$1.$2.tmp"; cat > "$tmp" || { rm -f -- "$tmp"; exit 2; }; '
    'if ln -- "$tmp" "$1" 2>/dev/null; then rm -f -- "$tmp"; exit 0; fi; '
    'rm -f -- "$tmp"; if [ -e "$1" ]; then exit 1; fi; exit 2'
)
_REPLACE = (
    'umask 022; mkdir -p -- "$(dirname -- "$1")" || exit 2; '
    'tmp="$1.$2.tmp"; cat > "$tmp" && mv -f -- "$tmp" "$1" || { rm -f -- "$tmp"; exit 2; }'
)
_READ = 'if [ ! -e "$1" ]; then exit 3; fi; cat -- "$1"'
_REMOVE = 'rm -f -- "$1"'


def _script(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "sh", *args]


class SshTransport:
    """asyncssh, one reused connection per node. Host keys are always checked
    (`ssh.known_hosts`, default ~/.ssh/known_hosts); ~/.ssh/config is not read,
    so the inventory alone decides where a node is."""

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
            settings = self.inventory.ssh
            options: dict[str, Any] = {
                "host": node.ssh,
                "port": node.port,
                "username": node.user,
                "config": None,
                "connect_timeout": settings.connect_timeout,
                "keepalive_interval": 30,
            }
            if settings.known_hosts is not None:
                options["known_hosts"] = str(settings.known_hosts)
            if settings.identity_file is not None:
                options["client_keys"] = [str(settings.identity_file)]
            try:
                conn = await asyncssh.connect(**options)
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                raise TransportError(
                    f"cannot reach {node.name} ({node.user}@{node.ssh}:{node.port}): {exc}"
                ) from exc
            self._connections[node.name] = conn
            return conn

    async def _exec(
        self, node: Node, argv: list[str], *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        if not argv:
            raise ValueError("an empty command has no meaning")
        command = shlex.join(argv)
        for attempt in (1, 2):
            conn = await self._connection(node)
            try:
                result = await conn.run(command, input=stdin, check=False, timeout=timeout)
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

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        return await self._exec(node, argv, timeout=timeout)

    async def _run_input(
        self, node: Node, argv: list[str], stdin: str, timeout: float
    ) -> CommandResult:
        result = await self._exec(node, argv, timeout=timeout, stdin=stdin)
        if result.timed_out:
            raise TransportError(f"{node.name}: file operation timed out after {timeout:g}s")
        return result

    @property
    def _file_timeout(self) -> float:
        return max(5.0, self.inventory.ssh.connect_timeout)

    async def create_exclusive(self, node: Node, path: Path, content: str) -> bool:
        token = secrets.token_hex(6)
        result = await self._run_input(
            node, _script(_CREATE_EXCLUSIVE, str(path), token), content, self._file_timeout
        )
        if result.exit_status == 0:
            return True
        if result.exit_status == 1:
            return False
        raise TransportError(f"{node.name}: cannot create {path}: {result.stderr.strip()}")

    async def replace_text(self, node: Node, path: Path, content: str) -> None:
        token = secrets.token_hex(6)
        result = await self._run_input(
            node, _script(_REPLACE, str(path), token), content, self._file_timeout
        )
        if result.exit_status != 0:
            raise TransportError(f"{node.name}: cannot write {path}: {result.stderr.strip()}")

    async def read_text(self, node: Node, path: Path) -> str | None:
        result = await self.run(node, _script(_READ, str(path)), timeout=self._file_timeout)
        if result.exit_status == 3:
            return None
        if result.exit_status != 0:
            raise TransportError(f"{node.name}: cannot read {path}: {result.stderr.strip()}")
        return result.stdout

    async def remove(self, node: Node, path: Path) -> None:
        result = await self.run(node, _script(_REMOVE, str(path)), timeout=self._file_timeout)
        if result.exit_status != 0:
            raise TransportError(f"{node.name}: cannot remove {path}: {result.stderr.strip()}")

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
        for conn in connections.values():
            with contextlib.suppress(Exception):
                await conn.wait_closed()
