"""`HOST:PORT` listen addresses, parsed the same way by every service."""

from __future__ import annotations


def parse_listen(address: str, *, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (then `default_host`); port 0 picks a free one."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"listen address {address!r} must be HOST:PORT")
    host = host.removeprefix("[").removesuffix("]") or default_host
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"listen address {address!r}: {port!r} is not a port") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"listen address {address!r}: port out of range")
    return host, number
