"""The node transport for this machine: commands run here.

For the node this process runs on (the serve wrapper's head node, a node helper) and
for one-machine clusters and tests. Same contract as the SSH transport: argv only,
never a shell.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mlx_medic.transport.interface import CommandResult, output_text

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Node  # annotations only: the transport loads no pydantic


class LocalTransport:
    """Every node it is asked about is this machine."""

    # Keeps no history of what it ran: the serve wrapper renews its lease through it every
    # lease/4 for as long as it runs.

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        if not argv:
            raise ValueError("an empty command has no meaning")
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:  # as a shell over SSH would answer: 127, and why
            return CommandResult(127, "", f"{argv[0]}: {exc.strerror or exc}\n")
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except asyncio.CancelledError:
            process.kill()  # the caller gave up on it: never leave it running unowned
            await process.wait()
            raise
        except TimeoutError:
            process.kill()
            out, err = await process.communicate()
            return CommandResult(None, output_text(out), output_text(err), timed_out=True)
        return CommandResult(process.returncode, output_text(out), output_text(err))

    async def close(self) -> None:
        return None
