"""The clean: remove exactly what the shared staleness rule calls stale for one model.

What: the stale `tmp*` entries of the model's tmp and cache dirs (`tmp_rules.stale_entries`:
unused by any live process, unchanged for the dir's stale age, on the dir's filesystem;
a dir other models on the node share takes the longest of their ages), and mlx.launch's
leftover files of dead launches in the launch temp dirs (`tmp_rules.launcher_leftovers`).
Nothing outside those dirs; the exporter counts the same entries with the same rule.

How: each entry is checked again right before it is removed (the same inode, not a
symlink, still unused and still unchanged for the stale age: a run that started meanwhile
keeps its dir), then removed through directory descriptors: no symlink is followed (a
link inside an entry is unlinked, never entered), no other filesystem is entered (a mount
below an entry keeps the entry, reported as skipped).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.platform.open_paths import PathsInUse, paths_in_use
from mlx_medic.platform.weighers import Weigher, default_weigher
from mlx_medic.tmp_rules import ScopeDir, StaleEntry, launcher_leftovers, stale_entries

if TYPE_CHECKING:
    from mlx_medic.inventory import Model

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class EntryChanged(Exception):
    """The entry is not the one judged any more, or not removable as judged."""


@dataclass
class CleanReport:
    model: str
    node: str
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: int = 0  # removals that raised an error (not merely a changed entry)

    def skip(self, path: Path | str, reason: str) -> None:
        self.skipped.append({"path": str(path), "reason": reason})

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "node": self.node, "dry_run": self.dry_run,
                "removed": self.removed,
                "bytes_freed": sum(int(r["bytes"]) for r in self.removed),
                "skipped": self.skipped}  # fmt: skip


def remove_tree(parent_fd: int, name: str, dev: int) -> None:
    """Remove `name` below `parent_fd` and everything in it, never following a symlink
    and never entering another filesystem (EntryChanged: a mount is in the way)."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    if st.st_dev != dev:
        raise EntryChanged(f"{name} is on another filesystem")
    fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise EntryChanged(f"{name} was replaced while it was being removed")
        for child in os.listdir(fd):
            remove_tree(fd, child, dev)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


class Cleaner:
    def __init__(
        self,
        *,
        model: Model,
        node: str,
        dirs: Sequence[ScopeDir],
        launch_dirs: Sequence[Path],
        dry_run: bool = False,
        clock: Callable[[], float],
        in_use: Callable[[], PathsInUse] = paths_in_use,
        weigher: Weigher | None = None,
    ):
        self.model = model
        self.dirs = [d for d in dirs if model.name in d.models]
        self.launch_dirs = list(launch_dirs)
        self.clock = clock
        self.in_use = in_use
        self.weigher = weigher or default_weigher()
        self.report = CleanReport(model.name, node, dry_run)

    def run(self) -> CleanReport:
        self._clean_dirs()
        self._clean_leftovers()
        return self.report

    # --- stale tmp entries ---------------------------------------------------------------

    def _clean_dirs(self) -> None:
        """Judge every dir on one look at the open files, then look again once right
        before the removals (a walk of every process's fds each: not one per dir)."""
        judged_on = self.in_use() if self.dirs else PathsInUse()
        now = self.clock()
        scans = [(scope, stale_entries(scope.path, now, scope.stale_age, judged_on,
                                       self.weigher))
                 for scope in self.dirs]  # fmt: skip
        busy_now: PathsInUse | None = None
        for scope, scan in scans:
            if scan.error is not None:
                self.report.skip(scope.path, f"dir not read: {scan.error}")
            elif scan.entries and self.report.dry_run:
                for entry in scan.entries:
                    self.report.removed.append({"path": str(entry.path), "bytes": entry.bytes,
                                                "kind": _kind(entry)})  # fmt: skip
            elif scan.entries:
                if busy_now is None:
                    busy_now = self.in_use()  # looked at again right before removing
                self._remove(scope, scan.entries, busy_now)

    def _remove(self, scope: ScopeDir, entries: Sequence[StaleEntry], busy_now: PathsInUse) -> None:
        try:
            dir_fd = os.open(str(scope.path), _DIR_FLAGS)
        except OSError as exc:
            self.report.skip(scope.path, f"dir not opened: {exc.strerror or exc}")
            return
        try:
            label = str(scope.path)
            busy = busy_now.under(label) | busy_now.under(os.path.realpath(label))
            for entry in entries:
                try:
                    self._recheck(dir_fd, entry, scope.stale_age, busy)
                    remove_tree(dir_fd, entry.path.name, entry.device)
                except EntryChanged as why:
                    self.report.skip(entry.path, f"not removed: {why}")
                    continue
                except OSError as exc:
                    self.report.failed += 1
                    self.report.skip(entry.path, f"not removed: {exc.strerror or exc}")
                    continue
                self.report.removed.append({"path": str(entry.path), "bytes": entry.bytes,
                                            "kind": _kind(entry)})  # fmt: skip
        finally:
            os.close(dir_fd)

    def _recheck(self, dir_fd: int, entry: StaleEntry, stale_age: float, busy: set[str]) -> None:
        name = entry.path.name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise EntryChanged("gone already") from None
        if (st.st_dev, st.st_ino) != (entry.device, entry.inode) or stat.S_ISLNK(st.st_mode):
            raise EntryChanged("replaced since it was judged")
        if stat.S_ISDIR(st.st_mode) != entry.is_dir:
            raise EntryChanged("replaced since it was judged")
        if name in busy:
            raise EntryChanged("a live process uses it now")
        usage = self.weigher.weigh(dir_fd, entry.device, [name]).usages.get(name)
        if usage is None:
            raise EntryChanged("could not be weighed again")
        if self.clock() - usage.newest_mtime < stale_age:
            raise EntryChanged("changed since it was judged: not stale any more")

    # --- mlx.launch leftovers ---------------------------------------------------------------

    def _clean_leftovers(self) -> None:
        scan = launcher_leftovers(self.launch_dirs)
        for directory, why in scan.unreadable:
            self.report.skip(directory, f"launch temp dir not read: {why}")
        judged = {path: _inode(path) for path in scan.files}
        if self.report.dry_run:
            for path, inode in judged.items():
                if inode is not None:
                    self.report.removed.append(
                        {"path": str(path), "bytes": inode[1], "kind": "launch_leftover"})
            return
        still = set(launcher_leftovers(self.launch_dirs).files)  # the rule again, right before
        for path, inode in judged.items():
            if inode is None or path not in still or _inode(path) != inode:
                self.report.skip(path, "not removed: changed since it was judged")
                continue
            try:
                _unlink_in(path)
            except OSError as exc:
                self.report.failed += 1
                self.report.skip(path, f"not removed: {exc.strerror or exc}")
                continue
            self.report.removed.append({"path": str(path), "bytes": inode[1],
                                        "kind": "launch_leftover"})  # fmt: skip


def _kind(entry: StaleEntry) -> str:
    return "stale_dir" if entry.is_dir else "stale_file"


def _inode(path: Path) -> tuple[int, int, int] | None:
    """(inode, allocated bytes, device) of a regular file that is not a symlink."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_ino, getattr(st, "st_blocks", 0) * 512, st.st_dev


def _unlink_in(path: Path) -> None:
    """Unlink a file by its name in its dir's descriptor (the file itself never followed)."""
    fd = os.open(str(path.parent), _DIR_FLAGS)
    try:
        os.unlink(path.name, dir_fd=fd)
    finally:
        os.close(fd)
