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

Not ours: the helper runs as the node's login user, and a shared tmp dir (`/tmp`) holds
other users' `tmp*` entries. An entry this user may not remove (another user's in a
sticky dir, one it may not empty or whose dir it may not write) or may not even read to
judge is reported in `not_ours` with its owner and left whole: never partly removed,
never a failure. A refusal found only while removing (something of another user's deep
inside) is reported the same way; a refusal on this user's own file is a failure.
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
from mlx_medic.processes.not_ours import owner_fields
from mlx_medic.tmp_rules import (
    STALE_PREFIX,
    ScopeDir,
    StaleEntry,
    launcher_leftovers,
    stale_entries,
)

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class EntryChanged(Exception):
    """The entry is not the one judged any more, or not removable as judged."""


class NotOurs(Exception):
    """A removal was refused (EPERM, EACCES): `where` (a path below the entry, or the
    entry itself) is `uid`'s."""

    def __init__(self, where: str, uid: int | None, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.uid, self.why = where, uid, why


@dataclass
class CleanReport:
    model: str
    node: str
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: int = 0  # removals that raised an error (not merely a changed entry)
    not_ours: list[dict[str, Any]] = field(default_factory=list)  # may not remove: left

    def skip(self, path: Path | str, reason: str) -> None:
        self.skipped.append({"path": str(path), "reason": reason})

    def foreign(self, path: Path | str, kind: str, uid: int | None, why: str) -> None:
        """Another user's entry this helper may not remove (or read): named, left whole."""
        self.not_ours.append({"path": str(path), "kind": kind, **owner_fields(uid), "why": why})

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "node": self.node,
            "dry_run": self.dry_run,
            "removed": self.removed,
            "bytes_freed": sum(int(r["bytes"]) for r in self.removed),
            "skipped": self.skipped,
            "not_ours": self.not_ours,
        }


def remove_tree(parent_fd: int, name: str, dev: int, where: str | None = None) -> None:
    """Remove `name` below `parent_fd` and everything in it, never following a symlink
    and never entering another filesystem (EntryChanged: a mount is in the way; NotOurs:
    a removal was refused, naming whose it is)."""
    where = where or name
    try:
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
                remove_tree(fd, child, dev, f"{where}/{child}")
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent_fd)
    except PermissionError as exc:
        raise NotOurs(where, _refuser(parent_fd, name), exc.strerror or str(exc)) from None


def _refuser(parent_fd: int, name: str) -> int | None:
    """Whose refusal it was: the item's owner, or its dir's when the item is our own."""
    try:
        owner = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_uid
        return os.fstat(parent_fd).st_uid if owner == os.geteuid() else owner
    except OSError:
        return None


def _may(st: os.stat_result, bits: int) -> bool:
    """Whether the mode bits give this user `bits` (4 read, 2 write, 1 search) on `st`;
    ACLs aside (a refusal they make is caught when removing)."""
    if st.st_uid == os.geteuid():
        shift = 6
    elif st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def refusal(dir_st: os.stat_result, st: os.stat_result) -> str | None:
    """Why this user may not remove another user's entry `st` from the dir `dir_st`
    (None: its own entry, root, or one it may remove): checked before anything of it is
    touched, so another user's entry is never partly removed."""
    me = os.geteuid()
    if me == 0 or st.st_uid == me:
        return None
    if not _may(dir_st, 3):
        return "may not remove it: its dir is not writable by this user"
    if dir_st.st_mode & stat.S_ISVTX and dir_st.st_uid != me:
        return "may not remove it: another user's entry in a sticky dir"
    if stat.S_ISDIR(st.st_mode) and not _may(st, 7):
        return "may not empty it: another user's dir this user may not read or write"
    return None


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
        scans = [
            (scope, stale_entries(scope.path, now, scope.stale_age, judged_on, self.weigher))
            for scope in self.dirs
        ]
        busy_now: PathsInUse | None = None
        for scope, scan in scans:
            if scan.error is not None:
                self.report.skip(scope.path, f"dir not read: {scan.error}")
                continue
            entries = self._ours(scope, scan.entries, now)
            if entries and self.report.dry_run:
                for entry in entries:
                    self.report.removed.append(
                        {"path": str(entry.path), "bytes": entry.bytes, "kind": _kind(entry)}
                    )
            elif entries:
                if busy_now is None:
                    busy_now = self.in_use()  # looked at again right before removing
                self._remove(scope, entries, busy_now)

    def _ours(self, scope: ScopeDir, entries: Sequence[StaleEntry], now: float) -> list[StaleEntry]:
        """The stale entries this user may remove; the others in `not_ours`, and with them
        the old `tmp*` dirs of other users it may not even read (never judged: the rule
        cannot weigh them). Nothing to tell apart as root."""
        if os.geteuid() == 0:
            return list(entries)
        try:
            dir_st = os.stat(scope.path)
            names = os.listdir(scope.path)
        except OSError:
            return list(entries)  # removal then says why
        ours = []
        for entry in entries:
            try:
                st = os.lstat(entry.path)
            except OSError:
                ours.append(entry)  # gone: the removal says so
                continue
            same = (st.st_dev, st.st_ino) == (entry.device, entry.inode)
            why = refusal(dir_st, st) if same else None  # a replaced one: the recheck's
            if why is None:
                ours.append(entry)
            else:
                self.report.foreign(entry.path, _kind(entry), st.st_uid, why)
        judged = {entry.path.name for entry in entries}
        for name in names:
            if name in judged or not name.startswith(STALE_PREFIX):
                continue
            try:
                st = os.lstat(scope.path / name)
            except OSError:
                continue
            if (
                stat.S_ISDIR(st.st_mode)
                and st.st_uid != os.geteuid()
                and st.st_dev == dir_st.st_dev
                and not _may(st, 5)
                and now - st.st_mtime >= scope.stale_age
            ):
                self.report.foreign(
                    scope.path / name,
                    "unreadable_dir",
                    st.st_uid,
                    "may not read it, so it was not judged: another user's",
                )
        return ours

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
                except NotOurs as refused:
                    self._refused(entry.path, _kind(entry), refused)
                    continue
                except OSError as exc:
                    self.report.failed += 1
                    self.report.skip(entry.path, f"not removed: {exc.strerror or exc}")
                    continue
                self.report.removed.append(
                    {"path": str(entry.path), "bytes": entry.bytes, "kind": _kind(entry)}
                )
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

    def _refused(self, path: Path, kind: str, refused: NotOurs) -> None:
        """Another user's part refused the removal: not ours; our own refusing: a failure."""
        inside = "" if refused.where == path.name else f" ({refused.where})"
        if refused.uid is not None and refused.uid == os.geteuid():
            self.report.failed += 1
            self.report.skip(path, f"not removed{inside}: {refused.why}")
            return
        self.report.foreign(path, kind, refused.uid, f"may not remove it{inside}: {refused.why}")

    # --- mlx.launch leftovers ---------------------------------------------------------------

    def _clean_leftovers(self) -> None:
        scan = launcher_leftovers(self.launch_dirs)
        for directory, why in scan.unreadable:
            self.report.skip(directory, f"launch temp dir not read: {why}")
        judged = {path: _inode(path) for path in scan.files}
        for path in list(judged):
            refused = _leftover_refusal(path)
            if refused is not None:
                self.report.foreign(path, "launch_leftover", *refused)
                del judged[path]
        if self.report.dry_run:
            for path, inode in judged.items():
                if inode is not None:
                    self.report.removed.append(
                        {"path": str(path), "bytes": inode[1], "kind": "launch_leftover"}
                    )
            return
        still = set(launcher_leftovers(self.launch_dirs).files)  # the rule again, right before
        for path, inode in judged.items():
            if inode is None or path not in still or _inode(path) != inode:
                self.report.skip(path, "not removed: changed since it was judged")
                continue
            try:
                _unlink_in(path)
            except NotOurs as refused:
                self._refused(path, "launch_leftover", refused)
                continue
            except OSError as exc:
                self.report.failed += 1
                self.report.skip(path, f"not removed: {exc.strerror or exc}")
                continue
            self.report.removed.append(
                {"path": str(path), "bytes": inode[1], "kind": "launch_leftover"}
            )


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


def _leftover_refusal(path: Path) -> tuple[int, str] | None:
    """(owner, why) when this user may not unlink another user's leftover; else None."""
    try:
        st, dir_st = os.lstat(path), os.stat(path.parent)
    except OSError:
        return None  # the removal then finds it changed
    why = refusal(dir_st, st)
    return None if why is None else (st.st_uid, why)


def _unlink_in(path: Path) -> None:
    """Unlink a file by its name in its dir's descriptor (the file itself never followed);
    NotOurs when the unlink is refused."""
    fd = os.open(str(path.parent), _DIR_FLAGS)
    try:
        os.unlink(path.name, dir_fd=fd)
    except PermissionError as exc:
        raise NotOurs(path.name, _refuser(fd, path.name), exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
