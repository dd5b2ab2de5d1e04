"""How mlx-medic acts on a node: the interface, this machine, SSH, and the two routed.

The transports are imported from their modules only when asked for (`from
mlx_medic.transport import SshTransport` works, PEP 562), so importing the interface
loads neither asyncssh nor asyncio: the exporter, `mlx-medic probe` and the node helpers
that read a `CommandResult` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_medic.transport.interface import (
    CommandResult,
    NodeTransport,
    TransportError,
    output_text,
)

if TYPE_CHECKING:
    from mlx_medic.transport.local import LocalTransport
    from mlx_medic.transport.routed import RoutedTransport
    from mlx_medic.transport.ssh import SshTransport

__all__ = [
    "CommandResult",
    "LocalTransport",
    "NodeTransport",
    "RoutedTransport",
    "SshTransport",
    "TransportError",
    "output_text",
]


_LAZY = {
    "LocalTransport": "mlx_medic.transport.local",
    "RoutedTransport": "mlx_medic.transport.routed",
    "SshTransport": "mlx_medic.transport.ssh",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
