"""What a node helper may not touch is an answer, not a crash.

The helpers run as the node's login user, not root (docs/security.md). On a shared node
another user's `/tmp/tmp.*` entry or a look-alike process that user may not signal is
not the model's to end: the sweep and the clean report it as `not ours`, with its owner
and its pid or path, leave it alone and go on with what they may do. One place for how
an owner is found and named, so both helpers name it alike.
"""

from __future__ import annotations

import os
import pwd
import sys
from typing import Any


def user_name(uid: int | None) -> str:
    """The user's name, or its uid when the passwd database has none; "unknown" for None."""
    if uid is None:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_uid(pid: int) -> int | None:
    """The real uid of `pid` (what `kill` permission is judged by), None when unreadable."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"Uid:"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None
    import psutil

    try:
        return int(psutil.Process(pid).uids().real)
    except psutil.Error:
        return None


def may_signal(pid: int) -> bool:
    """Whether this process may signal `pid` (signal 0 sends nothing, only checks); a pid
    that is gone counts as allowed: the signal itself then finds it gone."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False
    except ProcessLookupError:
        return True
    return True


def owner_fields(uid: int | None) -> dict[str, Any]:
    """`owner` (a name, or the uid as text) and `uid`: how a reply names whose it is."""
    return {"owner": user_name(uid), "uid": uid}
