"""Reading the small file a rank names in its environment (its MLX_HOSTFILE): as the
rank sees it, and never a symlink, a FIFO, a device or a large file, whatever path the
process hands an exporter that runs as root."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mlx_medic.platform.process_files import LIMIT, read_process_file
from tests.tools import require_root, require_tool


def test_a_regular_file_is_read(tmp_path: Path):
    hostfile = tmp_path / "tmp.AAAA"
    hostfile.write_text('[["127.0.0.2:45000"], ["127.0.0.3:45001"]]\n')
    assert read_process_file(os.getpid(), str(hostfile)) == hostfile.read_text()


def test_a_symlink_a_fifo_a_device_a_large_file_or_a_relative_path_is_refused(tmp_path: Path):
    target = tmp_path / "target"
    target.write_text("secret")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block without O_NONBLOCK
    (tmp_path / "large").write_bytes(b"x" * (LIMIT + 1))
    started = time.monotonic()
    for path in (
        tmp_path / "link",
        tmp_path / "fifo",
        Path("/dev/zero"),
        tmp_path / "large",
        tmp_path / "missing",
        tmp_path,
    ):
        assert read_process_file(os.getpid(), str(path)) is None, path
    assert read_process_file(os.getpid(), "target") is None
    assert time.monotonic() - started < 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mount namespaces")
def test_on_linux_the_file_is_read_in_the_processs_own_mount_namespace():
    """A service with a private /tmp (systemd PrivateTmp=) wrote its hostfile there."""
    require_root()
    unshare = require_tool("unshare")  # fails under CI when missing
    name = f"mlx-medic-hostfile-{uuid.uuid4().hex[:8]}"
    ready = Path("/var/tmp") / f"{name}.ready"
    script = (
        f"mount -t tmpfs tmpfs /tmp && echo private > /tmp/{name} && touch {ready} && exec sleep 60"
    )
    rank = subprocess.Popen([unshare, "--mount", "--propagation", "private", "sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert rank.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert not Path(f"/tmp/{name}").exists()  # not in the exporter's /tmp
        assert read_process_file(rank.pid, f"/tmp/{name}") == "private\n"
    finally:
        rank.kill()
        rank.wait()
        ready.unlink(missing_ok=True)
