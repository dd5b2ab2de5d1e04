"""What every node transport offers: argv commands and a few atomic file operations.

The callers (the model lock, later the node helpers and the serve wrapper) act on a
node without knowing whether it is this machine or one reached over SSH. Commands
are argv lists, never shell text, on every implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mlx_medic.inventory import Node


@dataclass(frozen=True)
class CommandResult:
    exit_status: int | None  # None: killed by a signal or timed out
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class TransportError(RuntimeError):
    """The node could not be reached or did not answer: neither success nor failure."""


class NodeTransport(Protocol):
    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult: ...

    async def create_exclusive(self, node: Node, path: Path, content: str) -> bool:
        """Create `path` with `content` only if it does not exist; atomic, and the file
        is never seen half-written. True if created, False if it already existed."""
        ...

    async def replace_text(self, node: Node, path: Path, content: str) -> None:
        """Overwrite `path` atomically (write a temporary file, rename it over)."""
        ...

    async def read_text(self, node: Node, path: Path) -> str | None:
        """The file's text, or None if it does not exist."""
        ...

    async def remove(self, node: Node, path: Path) -> None: ...

    async def close(self) -> None: ...


def output_text(data: object) -> str:
    """A command's captured output as text (bytes decoded, undecodable bytes replaced)."""
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data)
