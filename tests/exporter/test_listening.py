"""Whether a process listens on the model's port: real sockets, and a probe that reads
no process's descriptors where nothing listens on the port (a peer's hundred orphans)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.platform.listening import (
    LinuxListening,
    listening_probe,
    netlink_listening,
    parse_proc_net_tcp,
    psutil_listening,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# /proc/net/tcp as Linux writes it: a listener on 127.0.0.1:8080 (0x1F90), a connection.
PROC_NET_TCP = "\n".join(
    [
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
        " inode",
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0"
        " 4242 1 0000000000000000 100 0 0 10 0",
        "   1: 0100007F:1F90 0100007F:D0A2 01 00000000:00000000 00:00000000 00000000     0        0"
        " 4343 1 0000000000000000 20 4 30 10 -1",
        "",
    ]
)


def test_the_socket_table_gives_the_listening_sockets_by_port():
    assert parse_proc_net_tcp(PROC_NET_TCP) == {8080: {"4242"}}


@pytest.fixture
def listener():
    """A child that listens on a free port, and the port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.close()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket();"
            " s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            f" s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True);"
            " time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    yield child.pid, port
    child.kill()
    child.wait()


def test_a_process_that_listens_on_the_port_is_found_by_every_probe(listener):
    pid, port = listener
    for probe in (LinuxListening(), psutil_listening, listening_probe()):
        assert probe(pid, port) is True
        assert probe(pid, port + 1 if port < 65535 else port - 1) is False
        assert probe(os.getpid(), port) is False  # something listens there, not this one


def test_the_netlink_dump_and_the_proc_table_name_the_same_listening_socket(listener):
    _pid, port = listener
    by_netlink = netlink_listening(socket.AF_INET)
    by_proc = parse_proc_net_tcp(Path("/proc/net/tcp").read_text())
    assert by_netlink[port] == by_proc[port] and len(by_netlink[port]) == 1
    assert all(len(inodes) >= 1 for inodes in by_netlink.values())


def test_where_nothing_listens_on_the_port_no_descriptor_is_read(tmp_path: Path):
    root = tmp_path / "proc"
    (root / "10" / "net").mkdir(parents=True)
    (root / "10" / "ns").mkdir()
    (root / "10" / "ns" / "net").symlink_to("net:[4026531840]")
    (root / "10" / "net" / "tcp").write_text(PROC_NET_TCP)
    (root / "10" / "fd").write_text("")  # listing it fails: the answer would be None
    probe = LinuxListening(proc_root=str(root))
    assert probe(10, 9999) is False  # nothing listens on 9999: fd never listed
    assert probe(10, 8080) is None  # something does: fd listed, and it cannot be


def test_a_process_that_is_gone_listens_on_nothing(tmp_path: Path):
    assert LinuxListening(proc_root=str(tmp_path))(12345, 80) is False
