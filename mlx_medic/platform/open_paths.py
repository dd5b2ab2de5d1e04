"""Paths that live processes are using: working directories and open files.

A tmp dir that a process works in or has a file open in is not stale, whatever
its age. Linux reads /proc directly (psutil's `open_files()` leaves out
directories and deleted files, and an fd on a directory is exactly what a
`TemporaryDirectory` user may hold); macOS asks psutil for `cwd()` and
`open_files()`. A file only mapped (fd closed) is not seen, on either platform:
reading every process's maps costs more than the whole tree walk. Processes
we may not inspect (another user's, when not root) are counted in
`unreadable`, so callers can say the answer is partial.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import psutil

_DELETED = " (deleted)"


@dataclass
class PathsInUse:
    paths: set[str] = field(default_factory=set)
    unreadable: int = 0  # processes whose paths could not be read

    def under(self, directory: str) -> set[str]:
        """First path components below `directory` that are in use (`tmpabc` for .../tmpabc/x)."""
        prefix = directory.rstrip("/") + "/"
        names: set[str] = set()
        for path in self.paths:
            if path.startswith(prefix):
                names.add(path[len(prefix) :].split("/", 1)[0])
        names.discard("")
        return names


def _readlink(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    if target.endswith(_DELETED):
        target = target[: -len(_DELETED)]
    return target if target.startswith("/") else None


def _proc_paths(proc_root: str, pid: str) -> Iterator[str]:
    base = f"{proc_root}/{pid}"
    cwd = _readlink(f"{base}/cwd")
    if cwd:
        yield cwd
    for fd in os.listdir(f"{base}/fd"):  # PermissionError: not ours to see
        target = _readlink(f"{base}/fd/{fd}")
        if target:
            yield target


def linux_paths_in_use(proc_root: str = "/proc") -> PathsInUse:
    found = PathsInUse()
    for pid in os.listdir(proc_root):
        if not pid.isdigit():
            continue
        try:
            found.paths.update(_proc_paths(proc_root, pid))
        except FileNotFoundError:
            continue  # exited while we looked
        except PermissionError:
            found.unreadable += 1
    return found


def psutil_paths_in_use(
    process_iter: Callable[[], Iterable[psutil.Process]] = psutil.process_iter,
) -> PathsInUse:
    found = PathsInUse()
    for process in process_iter():
        try:
            found.paths.add(process.cwd())
            found.paths.update(f.path for f in process.open_files())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except (psutil.AccessDenied, OSError):
            found.unreadable += 1
    found.paths.discard("")
    return found


def paths_in_use(platform: str = sys.platform) -> PathsInUse:
    if platform.startswith("linux"):
        return linux_paths_in_use()
    return psutil_paths_in_use()


def environment_values(
    names: Iterable[str],
    process_iter: Callable[[], Iterable[psutil.Process]] = psutil.process_iter,
) -> set[str]:
    """Values of the named environment variables in every process we may read.

    A rank keeps `MLX_HOSTFILE`/`MLX_IBV_DEVICES` pointing at its mktemp file;
    such a file is in use, not left over.
    """
    wanted = tuple(names)
    values: set[str] = set()
    for process in process_iter():
        try:
            environ = process.environ()
        except (psutil.Error, OSError):
            continue
        values.update(environ[n] for n in wanted if environ.get(n))
    return values
