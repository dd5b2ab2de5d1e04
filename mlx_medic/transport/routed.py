"""This node locally, every other node through another transport (SSH).

What a process that runs ON an inventory node needs (the serve wrapper on the head,
a node helper): its own node is this machine, so nothing goes over SSH to itself,
and a question about a peer (is this pid alive there?) is asked on that peer, never
answered from this machine's process table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_medic.transport.interface import CommandResult, NodeTransport

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Node  # annotations only: the transport loads no pydantic


class RoutedTransport:
    def __init__(self, this_node: str, local: NodeTransport, remote: NodeTransport):
        self.this_node = this_node
        self.local = local
        self.remote = remote

    def _for(self, node: Node) -> NodeTransport:
        return self.local if node.name == self.this_node else self.remote

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        return await self._for(node).run(node, argv, timeout=timeout)

    async def close(self) -> None:
        await self.local.close()
        await self.remote.close()
