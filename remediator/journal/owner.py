"""Who runs a run: the owner tag (`host:pid`) the journal stores with each run, and
whether that owner still lives: start-up tells a run a dead process left in flight from
one that another replica on the same file still runs."""

from __future__ import annotations

import os
import socket


def this_host() -> str:
    """The host part of the owner tags this process writes and judges."""
    return socket.gethostname()


def owner_tag(hostname: str | None = None, pid: int | None = None) -> str:
    """`host:pid`: who runs a run, so start-up can tell a dead owner from a live one."""
    return f"{hostname or this_host()}:{pid or os.getpid()}"


def owner_gone(owner: str, host: str) -> bool:
    """True if `owner` is a process of `host` that is gone. Another host's owner is
    never judged here: its pid means nothing on this machine."""
    owner_host, _, pid = owner.rpartition(":")
    return owner_host == host and pid.isdigit() and not _pid_alive(int(pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
