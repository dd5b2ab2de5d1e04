"""Who is behind a command, as the journal and the node records name them: the person,
not `root`, when they used sudo."""

from __future__ import annotations

import os
import pwd
import socket


def who() -> str:
    """`user@host` of the person behind the command: under sudo the user who ran sudo
    (`SUDO_USER`), else the account of the real uid (never just `root` for a sudo'd person)."""
    user = os.environ.get("SUDO_USER") or user_name(os.getuid())
    return f"{user}@{socket.gethostname()}"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
