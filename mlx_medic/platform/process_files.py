"""A small file that a process names in its environment, read as that process sees it.

mlx.launch hands every rank the path of a `mktemp` file (`MLX_HOSTFILE`,
`MLX_IBV_DEVICES`). The path comes from the process, so the read refuses what a rank
could use to hang or mislead an exporter that runs as root: a symlink, a FIFO or a
device, a relative path, a file larger than `limit`. On Linux the path is resolved in the
process's own mount namespace (`/proc/<pid>/root`), so a service with a private /tmp
(systemd `PrivateTmp=`) is read right; on macOS, or where entering it is refused, the
path is read as the exporter sees it.
"""

from __future__ import annotations

import os
import stat
import sys

LIMIT = 64 * 1024  # a hostfile for dozens of nodes is a few KiB


def read_small_file(path: str, limit: int, *, dir_fd: int | None = None) -> bytes | None:
    """A regular file's bytes, at most `limit` of them; None for a symlink, a FIFO, a
    device or a directory, a larger file, or one that cannot be read. Never blocks."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _read_text(path: str, limit: int) -> str | None:
    data = read_small_file(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def read_process_file(
    pid: int, path: str, *, limit: int = LIMIT, proc_root: str | None = None
) -> str | None:
    """The text of `path` as process `pid` sees it, or None when it cannot be read safely."""
    if not path.startswith("/") or "\0" in path:
        return None
    if proc_root is None and sys.platform.startswith("linux"):
        proc_root = "/proc"
    if proc_root is not None:
        root = f"{proc_root}/{pid}/root"
        try:
            os.stat(root + "/")
        except OSError:
            pass  # not ours to enter (another user's process, no /proc): read it as it is
        else:
            return _read_text(root + path, limit)  # the process's view is the only truth
    return _read_text(path, limit)
