"""The node transport for this machine: commands run here, files are local files.

For the node this process runs on (the serve wrapper's head node, a node helper) and
for one-machine clusters and tests. Same contract as the SSH transport: argv only,
never a shell; file creation and replacement are atomic.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from mlx_medic.inventory import Node
from mlx_medic.transport.interface import CommandResult, output_text


class LocalTransport:
    """Every node it is asked about is this machine."""

    def __init__(self, root: Path | None = None):
        # With `root`, node N's files live under root/N: nodes stay apart in tests.
        self.root = root
        self.commands: list[tuple[str, list[str]]] = []

    def _path(self, node: Node, path: Path) -> Path:
        if self.root is None:
            return Path(path)
        return self.root / node.name / Path(path).relative_to(Path(path).anchor)

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if not argv:
            raise ValueError("an empty command has no meaning")
        self.commands.append((node.name, list(argv)))
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            out, err = await process.communicate()
            return CommandResult(None, output_text(out), output_text(err), timed_out=True)
        return CommandResult(process.returncode, output_text(out), output_text(err))

    async def create_exclusive(self, node: Node, path: Path, content: str) -> bool:
        target = self._path(node, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{secrets.token_hex(6)}.tmp")
        tmp.write_text(content, encoding="utf-8")
        try:
            os.link(tmp, target)  # fails if the target exists: the file appears whole or not
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    async def replace_text(self, node: Node, path: Path, content: str) -> None:
        target = self._path(node, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{secrets.token_hex(6)}.tmp")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, target)

    async def read_text(self, node: Node, path: Path) -> str | None:
        try:
            return self._path(node, path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    async def remove(self, node: Node, path: Path) -> None:
        self._path(node, path).unlink(missing_ok=True)

    async def close(self) -> None:
        return None
