"""One writer at a time for a node record that is read, judged and then rewritten.

A record is always written whole (state.files); what this adds is that a compare-then-
write (renew a lease only if the run is current, take the model lock only if it is free,
remove it only if it is still the one judged stale) is not interleaved with another
helper's. An flock ends with its process, so a helper that dies never leaves it taken.
The guard file belongs to the owner of its dir whoever makes it (state.layout), so root
and the node's login user can both take it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlx_medic.state.layout import StateFileError, open_lock_file

WAIT = 10.0  # helpers hold it for milliseconds; longer means a stuck writer


@contextmanager
def exclusive(guard: Path, wait: float | None = WAIT) -> Iterator[None]:
    """Hold an flock on `guard` (created, never followed through a symlink); give up with
    a StateFileError after `wait` seconds, or with None wait as long as it takes."""
    fd = open_lock_file(guard)
    try:
        _lock(fd, guard, wait)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _lock(fd: int, guard: Path, wait: float | None) -> None:
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if deadline is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if deadline is None or exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise StateFileError(f"cannot lock {guard}: {exc.strerror}") from None
            if time.monotonic() >= deadline:
                raise StateFileError(f"{guard} stayed locked for {wait:g}s") from None
            time.sleep(0.02)
