"""How mlx-medic acts on a node: the interface, this machine, SSH, and the two routed.

`SshTransport` is imported from `mlx_medic.transport.ssh` only when asked for
(`from mlx_medic.transport import SshTransport` works, PEP 562), so importing the
interface never loads asyncssh: the exporter and `mlx-medic probe` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_medic.transport.interface import (
    CommandResult,
    NodeTransport,
    TransportError,
    output_text,
)
from mlx_medic.transport.local import LocalTransport
from mlx_medic.transport.routed import RoutedTransport

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    if name == "SshTransport":
        from mlx_medic.transport.ssh import SshTransport

        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
