"""Ports for tests: free ones, and waiting for a listener."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now at `host` (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_listening(
    host: str, port: int, timeout: float = 30.0, *, check: Callable[[], None] | None = None
) -> None:
    """Return once `host:port` accepts a connection; TimeoutError names the address.

    `check` runs before every attempt and may raise to stop waiting early (the
    server already died, so its log says more than a timeout would).
    """
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            try:
                probe.connect((host, port))
                return
            except OSError:
                pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")
        time.sleep(0.05)
