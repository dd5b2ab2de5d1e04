"""What a loop or the demo may leave behind (nothing) or open to the network (loopback
only). Processes are found by the path of the files they were started with (a token no
process outside the test carries)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import psutil


def processes_naming(path: Path | str) -> list[int]:
    """Pids whose command line or working directory is under `path`."""
    text = str(path)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            cwd = str((proc / "cwd").readlink())
        except OSError:
            continue
        if text in cmdline or cwd.startswith(text):
            found.append(int(proc.name))
    return found


def listeners(*paths: Path | str) -> dict[tuple[str, int], int]:
    """Every TCP address listened on by a process naming one of `paths`: its pid."""
    pids = {pid for path in paths for pid in processes_naming(path)}
    return {
        (c.laddr.ip, c.laddr.port): c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    }


def off_loopback(addresses: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Those not on a loopback address (0.0.0.0 and :: included)."""
    return {
        address: pid
        for address, pid in addresses.items()
        if not ipaddress.ip_address(address[0]).is_loopback
    }
