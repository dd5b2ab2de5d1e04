"""As whom an on-call command writes the journal (who the person is: `mlx_medic.person`).

The journal is the service's file: a command run as root (under sudo) that created the
journal, its directory or SQLite's `-wal`/`-shm` as root would leave files the service
(its own user, e.g. `mlx-medic`) cannot write, and the next alert could not be journaled.
So root becomes the journal's owner before it opens anything; the person who acted is
still recorded, from `SUDO_USER`.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (the one whose owner new files get)."""
    return next(p for p in (path, *path.parents) if p.exists())


def journal_owner(journal: Path) -> tuple[int, int]:
    """uid and gid of the journal, or of the directory it will be created in."""
    info = nearest_existing(journal).stat()
    return info.st_uid, info.st_gid


def become_journal_owner(journal: Path) -> str | None:
    """As root, become the owner of the journal (or of the directory it will be created in)
    for the rest of the process, so every file written is theirs; HOME follows, so SSH uses
    their keys as the service does. The owner's name, or None when nothing changed (not
    root, or root owns the journal)."""
    if os.geteuid() != 0:
        return None
    uid, gid = journal_owner(journal)
    if uid == 0:
        return None
    try:
        account: pwd.struct_passwd | None = pwd.getpwuid(uid)
    except KeyError:
        account = None
    if account is not None:
        os.initgroups(account.pw_name, gid)
    else:
        os.setgroups([gid])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if account is None:
        return f"uid {uid}"
    os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    return account.pw_name


def can_write(journal: Path) -> bool:
    """Can this process write the journal (or create it, and its `-wal`, beside it)?"""
    if journal.exists():
        return os.access(journal, os.W_OK) and os.access(journal.parent, os.W_OK)
    return os.access(nearest_existing(journal), os.W_OK)
