"""The layout of a node's state dir (inventory `state_dir`, default /var/lib/mlx-medic):
who owns each part, with which mode, and how a part is made (docs/state-layout.md).

Why one place: the root exporter and the node's login user (its node helpers and the
serve wrapper) share this dir. A dir or lock file that root made 0700/0600 is one the
login user cannot open, and a remediation ends `locked` before its first step. So:

- everything in it belongs to the node's login user (`nodes.<name>.user`), with group
  `mlx-medic` when that group exists, else the user's primary group;
- dirs are DIR_MODE (2750: the group may read, e.g. the remediator's `node-id`; new
  entries inherit the group), files FILE_MODE (0640): no other user reads a record;
- what root creates is given to the owner of the dir it is created in (or to the owner
  named), so the login user can always open and flock it; `prepare_state_dir` makes
  the dir for the owner named and corrects what an older version or another unit left
  root-owned or with a wide mode;
- a process that cannot use a dir or a lock file gets a StateFileError naming the path,
  its owner and mode, and what was expected.

A leaf module (stdlib only): the exporter, the node helpers and the remediator use it.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mlx_medic.log_on_use import logger

LOGGER = "mlx_medic.state"  # mlx_medic.log_on_use: logging is imported when it logs

STATE_GROUP = "mlx-medic"  # the group docs/state-layout.md names
DIR_MODE = 0o2750
FILE_MODE = 0o640
DEFAULT_STATE_DIR = Path("/var/lib/mlx-medic")
# The remediator keeps its journal (and, on macOS, its log) in a dir of its own, never in
# a node's state dir: two units owning one dir re-own it whenever either starts.
REMEDIATOR_STATE_DIRECTORY = "mlx-medic-remediator"  # systemd StateDirectory=, under /var/lib
REMEDIATOR_STATE_DIR = Path("/var/lib") / REMEDIATOR_STATE_DIRECTORY

# The parts, relative to the state dir (docs/state-layout.md says who writes each).
NODE_ID = "node-id"
LEDGER = "pd-ledger.json"
LEDGER_LOCK = "pd-ledger.lock"
LOG_POSITIONS = "logs-positions.json"
LOCKS = "locks"  # <model>.lock, <model>.lock.guard, probe-<host>-<port>.lock
RUNS = "runs"  # <model>.current, <model>.lease, <model>.guard.log
RANKS = "runs/ranks"  # <pid>-<start>.json
BACKEND = "backend"  # <model>.json
SERVE = "serve"  # <model>.json
SERVICE = "service"  # <model>.stopped
DIRS = (LOCKS, RUNS, RANKS, BACKEND, SERVE, SERVICE)


def locks_dir(state_dir: Path) -> Path:
    """Where a node keeps its model locks and probe locks: the node helpers, the serve
    wrapper, the exporter's probes and `mlx-medic probe` all meet there."""
    return Path(state_dir) / LOCKS


_MAX_DEPTH = 4  # deeper than any part: the repair walk goes no further
_MAX_ENTRIES = 100_000  # nor past this many entries (a dir filled by someone else)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class StateFileError(RuntimeError):
    """A record, lock or dir of the state dir cannot be used; the message names it and why."""


@dataclass(frozen=True)
class Owner:
    """Who a part of the state dir belongs to, by number (a user need not have a name)."""

    uid: int
    gid: int

    @classmethod
    def of_process(cls) -> Owner:
        return cls(os.geteuid(), os.getegid())

    @classmethod
    def of_stat(cls, info: os.stat_result) -> Owner:
        return cls(info.st_uid, info.st_gid)

    def __str__(self) -> str:
        return f"{_user_name(self.uid)}:{_group_name(self.gid)}"


def node_owner(user: str, group: str = STATE_GROUP) -> Owner:
    """The owner of a node's state dir whose login user is `user`: that user, with `group`
    when it exists on this machine, else the user's primary group."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise StateFileError(
            f"the node's login user {user!r} (nodes.<name>.user) is no user"
            " on this machine: nobody can own its state dir"
        ) from None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = account.pw_gid
    return Owner(account.pw_uid, gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def describe(info: os.stat_result) -> str:
    """`medic:mlx-medic 2750`: an entry's owner and mode as the messages say them."""
    return f"{Owner.of_stat(info)} {stat.S_IMODE(info.st_mode):04o}"


def _expected(owner: Owner, mode: int) -> str:
    return f"{owner} {mode:04o}"


def _is_root() -> bool:
    return os.geteuid() == 0


def _settle(fd: int, owner: Owner, mode: int) -> None:
    """Give what this process just created to `owner` with `mode`. Root gives it away;
    anyone else keeps it and sets the group when it is one of its own."""
    info = os.fstat(fd)
    if _is_root():
        if Owner.of_stat(info) != owner:
            os.fchown(fd, owner.uid, owner.gid)
    elif info.st_gid != owner.gid and info.st_uid == os.geteuid():
        with contextlib.suppress(PermissionError):  # not a group of ours: the inherited one
            os.fchown(fd, -1, owner.gid)
    os.fchmod(fd, mode)  # after the chown, which may clear the setgid bit


def _correct(fd: int, info: os.stat_result, owner: Owner, mode: int) -> str | None:
    """As root, give an entry root made (or the owner's own, mode too wide) to `owner` with
    `mode`; what changed in words, or None. Another user's entry, or a file with more links
    than one (a hard link to a file elsewhere), is never touched."""
    if info.st_uid not in (0, owner.uid) or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
        return None
    if Owner.of_stat(info) == owner and stat.S_IMODE(info.st_mode) == mode:
        return None
    before = describe(info)
    if Owner.of_stat(info) != owner:
        os.fchown(fd, owner.uid, owner.gid)
    os.fchmod(fd, mode)
    return f"{before} -> {_expected(owner, mode)}"


def _parent_owner(path: Path) -> Owner:
    """Who a new entry of `path`'s dir belongs to when nobody is named: as root, the dir's
    owner (root gives away what it makes); otherwise this process, with the dir's group
    when the dir passes it on (setgid) or `mlx-medic` when that is one of ours."""
    info = os.stat(path.parent)
    if _is_root():
        return Owner.of_stat(info)
    if info.st_mode & stat.S_ISGID:
        return Owner(os.geteuid(), info.st_gid)
    with contextlib.suppress(KeyError):
        gid = grp.getgrnam(STATE_GROUP).gr_gid
        if gid in os.getgroups() or gid == os.getegid():
            return Owner(os.geteuid(), gid)
    return Owner.of_process()


def _cannot(
    what: str, path: Path, exc: OSError, owner: Owner, mode: int, where: Path
) -> StateFileError:
    """The error for a part this process cannot create or open, naming who owns what."""
    try:
        found = describe(os.stat(where))
    except OSError:
        found = "unreadable"
    fix = (
        "the exporter (root) makes the state dir and corrects its owners when it starts"
        " (systemd: its tmpfiles.d line, at boot)"
        if not _is_root()
        else "correct its owner or mode by hand"
    )
    return StateFileError(
        f"cannot {what} {path}: {exc.strerror or exc} ({where} is {found}; this process runs"
        f" as {_user_name(os.geteuid())}); {path} should be {_expected(owner, mode)}: {fix}"
    )


def ensure_dir(path: Path, owner: Owner | None = None) -> Path:
    """`path` (a dir in a state dir) as a dir; each one made here DIR_MODE, owned by
    `owner` (default: the owner of the dir it is made in). A dir root made that belongs to
    root while its parent does not (an older exporter's `locks/`) is given to the parent's
    owner; a dir this process cannot write is a StateFileError saying whose it is."""
    path = Path(path)
    missing: list[Path] = []
    here = path
    while not here.is_dir():
        if os.path.lexists(here):
            raise StateFileError(f"{here} is in the way of the state dir: not a directory")
        missing.insert(0, here)
        here = here.parent
    for directory in missing:
        target = owner or _parent_owner(directory)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made by another process just now
        except OSError as exc:
            raise _cannot("create", directory, exc, target, DIR_MODE, directory.parent) from None
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError as exc:  # replaced by a link between the mkdir and the open
            raise StateFileError(f"cannot open {directory}, just made: {exc.strerror}") from None
        try:
            _settle(fd, target, DIR_MODE)
        finally:
            os.close(fd)
    if not missing:
        _usable_dir(path, owner)
    return path


def _usable_dir(path: Path, owner: Owner | None) -> None:
    info = os.stat(path)
    target = owner or _parent_owner(path)
    if _is_root():
        if info.st_uid == 0 and target.uid != 0 and not path.is_symlink():
            fd = os.open(path, _DIR_FLAGS)
            try:
                changed = _correct(fd, os.fstat(fd), target, DIR_MODE)
            finally:
                os.close(fd)
            if changed:
                logger(LOGGER).warning(
                    "corrected %s: %s (root made it; the node's login user writes it)",
                    path,
                    changed,
                )
        return
    if not os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        error = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        raise _cannot("write in", path, error, target, DIR_MODE, path)


def open_lock_file(path: Path, owner: Owner | None = None) -> int:
    """An fd open for reading and writing on the lock file `path` (made FILE_MODE, owned by
    `owner`, default: the owner of its dir), to flock; never through a symlink, never a
    FIFO or device. One root made that belongs to root (an older exporter's 0600 probe
    lock) is given to the dir's owner; one this process cannot open is a StateFileError
    saying whose it is."""
    path = Path(path)
    ensure_dir(path.parent, owner)
    target = owner or _parent_owner(path)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    created = True
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        created = False
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if path.is_symlink():
                raise StateFileError(f"cannot open {path}: it is a symlink") from None
            raise _cannot("open", path, exc, target, FILE_MODE, path) from None
    except OSError as exc:
        raise _cannot("create", path, exc, target, FILE_MODE, path.parent) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateFileError(f"cannot use {path} as a lock: not a regular file")
        if created:
            _settle(fd, target, FILE_MODE)
        elif _is_root() and info.st_uid == 0 and target.uid != 0:
            changed = _correct(fd, info, target, FILE_MODE)
            if changed:
                logger(LOGGER).warning(
                    "corrected %s: %s (root made it; the node's login user locks it)", path, changed
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def settle_new_file(fd: int, path: Path, owner: Owner | None = None, mode: int = FILE_MODE) -> None:
    """Give a file this process just created at `path` (a temp file before its rename) to
    `owner` (default: the owner of its dir) with `mode`."""
    _settle(fd, owner or _parent_owner(Path(path)), mode)


@dataclass
class PreparedStateDir:
    """What `prepare_state_dir` did: entries it corrected, entries it had to leave."""

    state_dir: Path
    owner: Owner
    corrected: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def prepare_state_dir(state_dir: Path, owner: Owner) -> PreparedStateDir:
    """Make `state_dir` and its dirs (DIRS) for `owner`; as root, also correct every entry
    root made or the owner left wider than the layout (a probe lock 0600, a record 0644),
    never following a link. Missing parents above it are made 0755, as tmpfiles.d would.

    Whoever starts first calls this (the exporter at its start; the serve wrapper and the
    testbed may too): the result is the same in any order. A process other than root that
    cannot use the dir gets a StateFileError naming its owner and mode."""
    state_dir = Path(state_dir)
    prepared = PreparedStateDir(state_dir, owner)
    above = [p for p in state_dir.parents if not p.is_dir()]
    for parent in reversed(above):
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _cannot("create", parent, exc, owner, DIR_MODE, parent.parent) from None
        os.chmod(parent, 0o755)  # the umask may have narrowed it
    if not state_dir.is_dir():
        ensure_dir(state_dir, owner)
    elif not _is_root():
        _usable_dir(state_dir, owner)
    if _is_root():
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)  # the configured path may be a link
        try:
            changed = _correct(fd, os.fstat(fd), owner, DIR_MODE)
            if changed:
                prepared.corrected.append(f"{state_dir}: {changed}")
            _repair(fd, state_dir, owner, prepared, depth=1, seen=[0])
        finally:
            os.close(fd)
    for part in DIRS:
        ensure_dir(state_dir / part, owner)
    return prepared


def _repair(
    dir_fd: int, where: Path, owner: Owner, prepared: PreparedStateDir, depth: int, seen: list[int]
) -> None:
    """Correct the entries of one dir (by fd, so a rename under us cannot redirect it)."""
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        prepared.left.append(f"{where}: cannot list it ({exc.strerror or exc})")
        return
    for name in names:
        seen[0] += 1
        if seen[0] > _MAX_ENTRIES:
            prepared.left.append(f"{where}: more than {_MAX_ENTRIES} entries; stopped there")
            return
        path = where / name
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        is_dir = stat.S_ISDIR(info.st_mode)
        if not (is_dir or stat.S_ISREG(info.st_mode)):
            if info.st_uid == 0 and not stat.S_ISLNK(info.st_mode):
                prepared.left.append(f"{path}: not a file or a dir ({describe(info)}); left")
            continue  # a link is never followed, nor re-owned
        flags = (
            _DIR_FLAGS
            if is_dir
            else os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        )
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            prepared.left.append(f"{path}: cannot open it ({exc.strerror or exc}); left")
            continue
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                continue  # replaced between the look and the open: the next start sees it
            if opened.st_uid not in (0, owner.uid):
                prepared.left.append(f"{path}: belongs to {describe(opened)}; left as it is")
            elif not is_dir and opened.st_nlink > 1:
                prepared.left.append(f"{path}: has {opened.st_nlink} links; left as it is")
            else:
                changed = _correct(fd, opened, owner, DIR_MODE if is_dir else FILE_MODE)
                if changed:
                    prepared.corrected.append(f"{path}: {changed}")
            if is_dir and depth < _MAX_DEPTH:
                _repair(fd, path, owner, prepared, depth + 1, seen)
        finally:
            os.close(fd)
