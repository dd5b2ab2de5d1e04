"""What every node transport offers: argv commands, nothing else.

The callers (the node helpers' client, and through it the model lock and the remote
probe) act on a node without knowing whether it is this machine or one reached over SSH.
Commands are argv lists, never shell text, on every implementation. Over SSH they are
only `mlx-medic node ...`, so the key can be pinned to those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Node  # annotations only: the transport loads no pydantic


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

    async def close(self) -> None: ...


def output_text(data: object) -> str:
    """A command's captured output as text (bytes decoded, undecodable bytes replaced)."""
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data)
