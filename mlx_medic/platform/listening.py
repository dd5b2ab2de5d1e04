"""Whether a process listens on a TCP port: the rank that serves a model's port is never
an orphan.

On Linux the listening sockets are read once per scrape and network namespace
(`/proc/<pid>/net/tcp`, `tcp6`); a process's descriptors are looked at only when
something listens on the port at all, which on a peer (rank 0 serves on the head) is
never. So flagging a hundred ranks costs a hundred `readlink`s, not a hundred socket
tables. Elsewhere psutil asks per process. Answers are True, False, or None (cannot
tell: another user's process without root).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

Probe = Callable[[int, int], bool | None]  # (pid, port) -> listens on it?

_LISTEN = "0A"  # /proc/net/tcp `st` of a listening socket (include/net/tcp_states.h)


def parse_proc_net_tcp(text: str) -> dict[int, set[str]]:
    """Listening sockets of a `/proc/net/tcp` or `tcp6` table: port -> socket inodes."""
    found: dict[int, set[str]] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        _, _, port = fields[1].rpartition(":")
        try:
            found.setdefault(int(port, 16), set()).add(fields[9])
        except ValueError:
            continue
    return found


class LinuxListening:
    """One scrape's probe: socket tables are read once per network namespace."""

    def __init__(self, proc_root: str = "/proc"):
        self.root = proc_root
        self._tables: dict[str, dict[int, set[str]] | None] = {}

    def _table(self, pid: int) -> dict[int, set[str]] | None:
        namespace = os.readlink(f"{self.root}/{pid}/ns/net")
        if namespace not in self._tables:
            self._tables[namespace] = self._read_tables(pid)
        return self._tables[namespace]

    def _read_tables(self, pid: int) -> dict[int, set[str]] | None:
        table: dict[int, set[str]] = {}
        for name in ("tcp", "tcp6"):
            try:
                with open(f"{self.root}/{pid}/net/{name}", encoding="ascii") as handle:
                    text = handle.read()
            except FileNotFoundError:
                continue  # no IPv6
            except OSError:
                return None
            for port, inodes in parse_proc_net_tcp(text).items():
                table.setdefault(port, set()).update(inodes)
        return table

    def __call__(self, pid: int, port: int) -> bool | None:
        try:
            table = self._table(pid)
        except FileNotFoundError:
            return False  # gone
        except OSError:
            return None
        if table is None:
            return None
        inodes = table.get(port)
        if not inodes:
            return False
        wanted = {f"socket:[{inode}]" for inode in inodes}
        directory = f"{self.root}/{pid}/fd"
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return False
        except OSError:
            return None
        for name in names:
            try:
                if os.readlink(f"{directory}/{name}") in wanted:
                    return True
            except OSError:
                continue
        return False


def psutil_listening(pid: int, port: int) -> bool | None:
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    except (psutil.AccessDenied, OSError):
        return None
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def listening_probe() -> Probe:
    """A fresh probe for one scrape, for this platform."""
    if sys.platform.startswith("linux"):
        return LinuxListening()
    return psutil_listening
