"""Reading /proc from the host: which namespace a process is in, its pid there, its state.

The testbed only ever signals processes it can prove are its own (a pid it started, or a
process inside a PID namespace it created); these helpers are how it proves that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def all_pids() -> list[int]:
    return sorted(int(entry) for entry in os.listdir(PROC) if entry.isdigit())


def pid_namespace(pid: int) -> str | None:
    """`pid:[4026532...]` for a live process, None when it is gone or unreadable."""
    try:
        return os.readlink(PROC / str(pid) / "ns" / "pid")
    except OSError:
        return None


def pids_in_namespace(namespace: str) -> list[int]:
    """Host pids of every process whose PID namespace is `namespace`."""
    return [pid for pid in all_pids() if pid_namespace(pid) == namespace]


def status_fields(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict; empty when the process is gone."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def ns_pid(pid: int) -> int:
    """The pid as the innermost PID namespace sees it (last NSpid column)."""
    nspid = status_fields(pid).get("NSpid")
    if not nspid:
        raise ProcessLookupError(pid)
    return int(nspid.split()[-1])


def ppid(pid: int) -> int:
    value = status_fields(pid).get("PPid")
    if value is None:
        raise ProcessLookupError(pid)
    return int(value)


def state(pid: int) -> str | None:
    """The one-letter kernel state (R, S, D, T, t, Z, ...), None when gone."""
    value = status_fields(pid).get("State")
    return value[0] if value else None


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def children(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = (PROC / str(pid) / "task" / tid / "children").read_text()
        except OSError:
            continue
        found += [int(child) for child in text.split()]
    return sorted(set(found))


def freezer_cgroup(pid: int) -> str | None:
    """The process's cgroup v1 freezer path (`/` when in the root group)."""
    try:
        text = (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            return path
    return None


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    current = state(pid)
    return current is not None and current not in ("Z", "X")


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of `pids` is alive; returns the ones still alive at the deadline."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        remaining = [pid for pid in remaining if is_alive(pid)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(0.02)


def stop_child(process: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM a child we started, SIGKILL it after `grace` seconds, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(grace)
