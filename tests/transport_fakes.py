"""A transport for tests that need to see what ran: LocalTransport, recording each command.

LocalTransport itself keeps no history (the serve wrapper renews its lease through it for
as long as it runs)."""

from __future__ import annotations

from mlx_medic.inventory.schema import Node
from mlx_medic.transport import LocalTransport
from mlx_medic.transport.interface import CommandResult


class RecordingTransport(LocalTransport):
    """Runs commands on this machine as LocalTransport does; `commands`: (node, argv) of each."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[tuple[str, list[str]]] = []

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        self.commands.append((node.name, list(argv)))
        return await super().run(node, argv, timeout=timeout)
