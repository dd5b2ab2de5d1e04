"""The journal's files on disk: the SQLite file with its -wal and -shm, their modes and
group, and which file a connection writes.

The journal with its -wal and -shm is 0640: the service's user writes it, its group
(`mlx-medic`) may read it, nobody else.
"""

from __future__ import annotations

import grp
import os
import stat
from contextlib import suppress
from pathlib import Path

from mlx_medic.state.layout import STATE_GROUP

JOURNAL_MODE = 0o640  # the journal and its -wal, -shm: the service's user, its group reads
# Its dir stays searchable: the files' own mode keeps them private, and an on-call user
# without rights then gets the refusal that names the journal's owner, not EACCES.
JOURNAL_DIR_MODE = 0o755


def make_journal_file(path: Path) -> None:
    """Create the journal JOURNAL_MODE (group `mlx-medic` when it is one of ours) before
    SQLite does: SQLite makes it 0644 and gives its -wal and -shm the journal's own mode,
    so every file of it is readable by the service's user and group only. Missing dirs
    are made JOURNAL_DIR_MODE. A journal of ours an older version left wider is narrowed."""
    missing = [d for d in (path.parent, *path.parent.parents) if not d.is_dir()]
    for directory in reversed(missing):
        with suppress(FileExistsError):
            os.mkdir(directory, JOURNAL_DIR_MODE)
            os.chmod(directory, JOURNAL_DIR_MODE)  # the umask may have narrowed it
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, JOURNAL_MODE)
    except FileExistsError:
        narrow_modes(path)
        return
    except OSError:
        return  # SQLite says why, naming the file
    try:
        os.fchmod(fd, JOURNAL_MODE)
        with suppress(KeyError, PermissionError):  # not a group of ours: our own
            os.fchown(fd, -1, grp.getgrnam(STATE_GROUP).gr_gid)
    finally:
        os.close(fd)


def narrow_modes(path: Path) -> None:
    """The journal, -wal and -shm this user owns: readable by its group at most."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with suppress(OSError):
            info = os.stat(name)
            if info.st_uid == os.geteuid() and info.st_mode & 0o7137:
                os.chmod(name, stat.S_IMODE(info.st_mode) & JOURNAL_MODE)


def file_identity(path: Path) -> tuple[int, int]:
    """(device, inode): tells the file a connection opened from one put in its place."""
    info = os.stat(path)
    return info.st_dev, info.st_ino
