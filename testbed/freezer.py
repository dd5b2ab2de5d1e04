"""Real uninterruptible processes: a cgroup v1 freezer group, like the seed's `Us+` ranks.

A frozen task shows state `D` and a SIGKILL stays pending until the group is thawed
(the testbed's "reboot"). Frozen tasks also block a PID namespace from ending, so every
group made here is registered and thawed by `thaw_all()` (the cluster's close() calls it).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")
GROUP_PREFIX = "mlx-medic-test-"
_TOKEN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# Who made each group (pid and start time), so a later session can thaw and remove the
# groups of a session that was SIGKILLed (its atexit never ran) without touching live ones.
OWNERS_DIR = Path("/var/tmp/mlx-medic-testbed-locks/freezer")

_known: set[Path] = set()
_known_lock = threading.Lock()


class FreezerError(RuntimeError):
    pass


@dataclass
class FreezerGroup:
    path: Path
    pids: list[int] = field(default_factory=list)

    @property
    def state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def members(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pids.append(pid)

    def freeze(self, timeout: float = 10.0) -> None:
        _wait_state(self.path, "FROZEN", timeout)

    def thaw(self, timeout: float = 10.0) -> None:
        _wait_state(self.path, "THAWED", timeout)

    def remove(self) -> None:
        """Thaw, hand any survivor back to the root group, then rmdir."""
        remove_group(self.path)


def _wait_state(path: Path, wanted: str, timeout: float) -> None:
    state_file = path / "freezer.state"
    deadline = time.monotonic() + timeout
    while True:
        state_file.write_text(wanted)
        current = state_file.read_text().strip()
        if current == wanted:
            return
        if time.monotonic() >= deadline:
            raise FreezerError(f"{path}: freezer.state is {current}, wanted {wanted}")
        time.sleep(0.02)


def available() -> bool:
    return (FREEZER_ROOT / "cgroup.procs").exists()


def remove_group(path: Path) -> None:
    if path.exists():
        _thaw_and_rmdir(path)
    with _known_lock:
        _known.discard(path)
    (OWNERS_DIR / path.name).unlink(missing_ok=True)


def _thaw_and_rmdir(path: Path) -> None:
    with contextlib.suppress(OSError, FreezerError):
        _wait_state(path, "THAWED", 5.0)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            # Still has members (alive, or dying after the thaw): move them back.
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (FREEZER_ROOT / "cgroup.procs").write_text(pid)
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _identity(pid: int) -> str | None:
    """`<pid> <start time>`: a pid alone may be reused by the time anyone checks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return f"{pid} {fields[19]}"


def sweep_stale() -> list[Path]:
    """Thaw and remove testbed groups whose maker is dead; returns the ones removed."""
    removed: list[Path] = []
    if not OWNERS_DIR.is_dir():
        return removed
    for owner_file in OWNERS_DIR.iterdir():
        recorded = owner_file.read_text().strip()
        pid = recorded.split()[0] if recorded else ""
        if pid.isdigit() and _identity(int(pid)) == recorded:
            continue  # its maker still runs
        path = FREEZER_ROOT / owner_file.name
        if owner_file.name.startswith(GROUP_PREFIX):
            with contextlib.suppress(OSError):
                remove_group(path)
                removed.append(path)
        owner_file.unlink(missing_ok=True)
    return removed


def make_group(token: str, freeze: bool = False) -> FreezerGroup:
    """Make the empty group /sys/fs/cgroup/freezer/mlx-medic-test-<token>, owned by this
    process (`sweep_stale` removes it once we are dead; `thaw_all` and `remove_group` do
    it before). With `freeze` it is FROZEN already, so a process that joins it (writes
    its pid, or "0" for itself, to cgroup.procs) freezes at once: the simulated JACCL
    orphans freeze themselves that way from inside a node."""
    if not _TOKEN.match(token):
        raise ValueError(f"freezer token {token!r} must match {_TOKEN.pattern}")
    if not available():
        raise FreezerError(f"no cgroup v1 freezer mounted at {FREEZER_ROOT}")
    sweep_stale()
    path = FREEZER_ROOT / f"{GROUP_PREFIX}{token}"
    path.mkdir()
    OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    (OWNERS_DIR / path.name).write_text(_identity(os.getpid()) or "")
    with _known_lock:
        _known.add(path)
    group = FreezerGroup(path)
    if freeze:
        try:
            group.freeze()
        except BaseException:
            remove_group(path)
            raise
    return group


@contextlib.contextmanager
def frozen(pids: Iterable[int], token: str) -> Iterator[FreezerGroup]:
    """Freeze `pids` in /sys/fs/cgroup/freezer/mlx-medic-test-<token>; thaw and remove on exit."""
    group = make_group(token)
    try:
        for pid in pids:
            group.add(pid)
        group.freeze()
        yield group
    finally:
        remove_group(group.path)


def thaw_all() -> None:
    """Thaw and remove every group this process made that is still there."""
    with _known_lock:
        paths = list(_known)
    for path in paths:
        with contextlib.suppress(OSError):
            remove_group(path)


def thaw_group_of(cgroup_path: str) -> bool:
    """Thaw a testbed group by the path /proc/<pid>/cgroup names; other groups are left alone."""
    name = cgroup_path.strip("/")
    if not name.startswith(GROUP_PREFIX) or "/" in name:
        return False
    state_file = FREEZER_ROOT / name / "freezer.state"
    with contextlib.suppress(OSError):
        state_file.write_text("THAWED")
        return True
    return False
