"""Whether a process listens on a TCP port: the rank that serves a model's port is never
an orphan.

On Linux the listening sockets are read once per scrape and network namespace: for the
exporter's own namespace by a netlink sock_diag dump of listening sockets only (what
`ss -l` asks; reading /proc/net/tcp walks every connection and took 20 ms on a test VM),
for another namespace from `/proc/<pid>/net/tcp` and `tcp6`. A process's descriptors
are looked at only when something listens on the port at all, which on a peer (rank 0
serves on the head) is never: flagging a hundred ranks costs a hundred `readlink`s.
Elsewhere psutil asks per process. Answers are True, False, or None (cannot tell:
another user's process without root).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
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


# linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_SOCKID_BYTES = 48  # inet_diag_sockid
_DIAG_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2 up to its sockid


def netlink_listening(family: int) -> dict[int, set[str]]:
    """Listening TCP sockets of one address family in this network namespace: port ->
    socket inodes, by one sock_diag dump that holds listeners only."""
    request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN)
    request += bytes(_SOCKID_BYTES)
    header = _NLMSG.pack(
        _NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
    )
    found: dict[int, set[str]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as link:
        link.sendall(header + request)
        while True:
            data = link.recv(65536)
            if not data:
                raise OSError("sock_diag: the dump ended without NLMSG_DONE")
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR or length < _NLMSG.size:
                    raise OSError("sock_diag: the kernel refused the dump")
                body = offset + _NLMSG.size  # inet_diag_msg: 4 bytes, sockid, 5 x u32
                (port,) = struct.unpack_from("!H", data, body + 4)
                (inode,) = struct.unpack_from("=I", data, body + 4 + _SOCKID_BYTES + 16)
                found.setdefault(port, set()).add(str(inode))
                offset += (length + 3) & ~3


class LinuxListening:
    """One scrape's probe: socket tables are read once per network namespace."""

    def __init__(self, proc_root: str = "/proc"):
        self.root = proc_root
        self._tables: dict[str, dict[int, set[str]] | None] = {}
        self._own: str | None = None  # the exporter's network namespace
        with contextlib.suppress(OSError):
            self._own = os.readlink(f"{proc_root}/self/ns/net")

    def _table(self, pid: int) -> dict[int, set[str]] | None:
        namespace = os.readlink(f"{self.root}/{pid}/ns/net")
        if namespace not in self._tables:
            table = self._netlink_tables() if namespace == self._own else None
            self._tables[namespace] = table if table is not None else self._read_tables(pid)
        return self._tables[namespace]

    @staticmethod
    def _netlink_tables() -> dict[int, set[str]] | None:
        table: dict[int, set[str]] = {}
        try:
            for family in (socket.AF_INET, socket.AF_INET6):
                for port, inodes in netlink_listening(family).items():
                    table.setdefault(port, set()).update(inodes)
        except (OSError, struct.error):
            return None  # no sock_diag here: the /proc tables answer instead
        return table

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
