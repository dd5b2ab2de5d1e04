"""Weighing tmp entries the way `du -s` does, with the newest mtime in each tree.

What the stale-tmp rule (`mlx_medic.tmp_rules`) needs per entry: allocated blocks
(`st_blocks * 512`, so a sparse file is not its apparent size), hard links once
across all entries of a dir, symlinks never followed, other filesystems never
entered, and the newest mtime anywhere below. Two weighers give the same numbers:
GNU du (`du.py`, one run per dir: Linux's default, about 1.5 times faster) and our
own walk (macOS, whose du has no `--time`, and whenever du fails).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from mlx_medic.log_on_use import logger
from mlx_medic.platform.du import DuError, gnu_du, run_du

LOGGER = "mlx_medic.platform"  # mlx_medic.log_on_use: logging is imported when it logs

MAX_DEPTH = 200  # deeper trees are not walked further (and count as skipped)

_S_IFMT, _S_IFDIR = 0o170000, stat.S_IFDIR
_DIR_FLAGS = (
    os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


@dataclass
class TreeUsage:
    """What `du -s` would count, plus the newest mtime, for one entry."""

    blocks: int = 0
    newest_mtime: float = 0.0
    skipped: int = 0


def _account(usage: TreeUsage, st: os.stat_result, seen: set[tuple[int, int]]) -> None:
    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return  # a hard link we already counted, as du does
        seen.add(key)
    usage.blocks += st.st_blocks
    if st.st_mtime > usage.newest_mtime:
        usage.newest_mtime = st.st_mtime


def _walk_fd(fd: int, dev: int, usage: TreeUsage, seen: set[tuple[int, int]], depth: int) -> None:
    # The hot loop of the walk: one lstat per entry and nothing else, locals only.
    stat_at = os.stat
    blocks, newest, subdirs = 0, usage.newest_mtime, []
    for name in os.listdir(fd):
        try:
            st = stat_at(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            usage.skipped += 1  # vanished or unreadable while we looked
            continue
        if st.st_mode & _S_IFMT == _S_IFDIR:
            if st.st_dev != dev:
                continue  # a mount point: another filesystem is not this dir's usage
            subdirs.append(name)
        elif st.st_nlink > 1:  # files, and symlinks as themselves (never followed)
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue  # a hard link we already counted, as du does
            seen.add(key)
        blocks += st.st_blocks
        if st.st_mtime > newest:
            newest = st.st_mtime
    usage.blocks += blocks
    usage.newest_mtime = newest
    for name in subdirs:
        if depth >= MAX_DEPTH:
            usage.skipped += 1
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)  # O_NOFOLLOW: no symlink swapped in
        except OSError:
            usage.skipped += 1
            continue
        try:
            _walk_fd(child, dev, usage, seen, depth + 1)
        except OSError:
            usage.skipped += 1
        finally:
            os.close(child)


def tree_usage(
    parent_fd: int, name: str, dev: int, seen: set[tuple[int, int]] | None = None
) -> TreeUsage | None:
    """Allocated blocks and newest mtime of `name` (in `parent_fd`) and all below it.

    None when `name` is a hard link to a file already counted: like du given
    both names, its bytes are not there twice and it is no entry of its own.
    """
    seen = set() if seen is None else seen
    usage = TreeUsage()
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) in seen:
        return None
    _account(usage, st, seen)
    if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            _walk_fd(fd, dev, usage, seen, 1)
        finally:
            os.close(fd)
    return usage


@dataclass(frozen=True)
class Weighing:
    """The entries of one dir that could be weighed, and how many parts could not."""

    usages: dict[str, TreeUsage]
    skipped: int


class PythonWeigher:
    """Our own walk: works everywhere (macOS's du has no --time), slower than GNU du."""

    def weigh(self, dir_fd: int, dev: int, names: Sequence[str]) -> Weighing:
        seen: set[tuple[int, int]] = set()  # shared: a hard link across entries counts once
        usages: dict[str, TreeUsage] = {}
        skipped = 0
        for name in names:
            try:
                usage = tree_usage(dir_fd, name, dev, seen)
            except OSError:
                skipped += 1  # vanished or unreadable since we listed it
                continue
            if usage is not None:
                skipped += usage.skipped
                usages[name] = usage
        return Weighing(usages, skipped)


class DuWeigher:
    """GNU du weighs all of a dir's entries in one run; if du fails, our walk does it."""

    def __init__(self, du: str, fallback: PythonWeigher | None = None):
        self.du = du
        self.fallback = fallback or PythonWeigher()
        self._failing = False  # log a failure once, not on every walk

    def weigh(self, dir_fd: int, dev: int, names: Sequence[str]) -> Weighing:
        try:
            run = run_du(self.du, dir_fd, names)
        except DuError as exc:
            if not self._failing:
                logger(LOGGER).warning("tmp walk: du failed, walking in Python instead: %s", exc)
            self._failing = True
            return self.fallback.weigh(dir_fd, dev, names)
        if self._failing:
            logger(LOGGER).info("tmp walk: du works again")
            self._failing = False
        usages = {
            name: TreeUsage(found.bytes // 512, found.newest_mtime)
            for name, found in run.usages.items()
        }
        return Weighing(usages, run.errors)


Weigher = PythonWeigher | DuWeigher


def default_weigher() -> Weigher:
    """GNU du where it can do the job (checked once per process), else our walk."""
    du = gnu_du()
    return DuWeigher(du) if du is not None else PythonWeigher()
