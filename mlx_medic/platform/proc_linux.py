"""A fast Linux process table that reads /proc directly.

psutil reads several files per process; on a node with thousands of
unrelated processes that dominates a scrape. Here a scrape lists /proc once
and keys a cache by (pid, inode of /proc/<pid>): procfs gives every new
process a fresh inode, and `scandir` returns it without a `stat`, so a known
process costs no file read at all. Command lines are read for new processes
(and on the recheck schedule, to see an `exec`); `stat` only for processes
with a role and their ancestors.

Nothing here fails a scan: a process that vanishes mid-scan, an entry we may
not read, or a command line with odd bytes just yields less information.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.log_on_use import logger
from mlx_medic.platform.command_lines import CachedCommand, recheck
from mlx_medic.processes.info import ProcessInfo, Role, State, parse_environ
from mlx_medic.processes.roles import Classifier, classify, resolve_exo_runners

LOGGER = __name__  # mlx_medic.log_on_use: logging is imported when it logs

# /proc/<pid>/stat state letters (proc(5)); every letter maps into the closed set.
STATE_LETTERS: dict[str, State] = {
    "R": State.RUNNING,
    "S": State.SLEEPING,
    "I": State.SLEEPING,  # idle kernel thread
    "D": State.UNINTERRUPTIBLE,
    "T": State.STOPPED,
    "t": State.STOPPED,  # stopped by a tracer
    "Z": State.ZOMBIE,
    "X": State.ZOMBIE,  # dead, about to vanish
    "x": State.ZOMBIE,
    "W": State.SLEEPING,  # paging (pre-2.6) / waking
    "K": State.SLEEPING,  # wakekill (2.6.33-3.13)
    "P": State.SLEEPING,  # parked kernel thread
}


def state_from_letter(letter: str) -> State:
    return STATE_LETTERS.get(letter, State.SLEEPING)


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat this table uses."""

    comm: str
    state: State
    ppid: int
    starttime: int  # clock ticks after boot
    letter: str = ""  # the state letter as the kernel wrote it


def parse_stat(raw: bytes) -> Stat:
    """Parse `pid (comm) S ppid ...`; comm may hold spaces and parentheses."""
    head, sep, rest = raw.rpartition(b")")
    if not sep:
        raise ValueError("no ')' after comm")
    comm = head.partition(b"(")[2].decode("utf-8", "replace")
    fields = rest.split()
    if len(fields) < 20:
        raise ValueError(f"{len(fields)} fields after comm, expected at least 20")
    letter = fields[0].decode("ascii", "replace")
    return Stat(
        comm=comm,
        state=state_from_letter(letter),
        ppid=int(fields[1]),
        starttime=int(fields[19]),
        letter=letter,
    )


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """argv from NUL-separated bytes; undecodable bytes become U+FFFD so label
    values always encode."""
    if not raw:
        return ()
    return tuple(part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0"))


@dataclass(slots=True)
class _Entry(CachedCommand):
    """The cached command plus what tells this process from another with its pid.

    A process that is no candidate keeps no argv (`cmdline` is empty), only the hash of
    its raw command line to see an `exec` at its re-check: on a busy node those are
    thousands of processes no rule reads (1.5 MiB of strings at 8,000, bench/busy_node).
    One that turns out to be a rank's ancestor reads its argv again."""

    ino: int = 0  # of /proc/<pid>: a new process gets a new one
    starttime: int | None = None  # checked for processes with a role: pid and inode reused
    argv_hash: int | None = None  # hash() of the raw /proc/<pid>/cmdline it was classified by


def read_boot_time(proc_root: str | os.PathLike[str] = "/proc") -> float:
    """The kernel's boot time (`btime` in <proc_root>/stat): with the start in clock ticks
    it makes a process's start time. OSError when unreadable, ValueError when it has none."""
    path = Path(proc_root) / "stat"
    for line in path.read_bytes().splitlines():
        if line.startswith(b"btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                break
    raise ValueError(f"no boot time (btime) in {path}")


class LinuxProcessTable:
    """`ProcessTable` over a /proc tree; `proc_root` lets tests build a fake one."""

    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        monotonic: Callable[[], float] = time.monotonic,
        classifier: Classifier = classify,
    ):
        self.root = Path(proc_root)
        self.monotonic = monotonic
        self.classifier = classifier
        self._cache: dict[int, _Entry] = {}
        self._ticks = os.sysconf("SC_CLK_TCK")
        try:
            self._boot_time = read_boot_time(self.root)
        except (OSError, ValueError):
            logger(LOGGER).warning(
                "cannot read btime from %s/stat; process ages will be off", self.root
            )
            self._boot_time = 0.0
        self.read_errors = 0  # entries that could not be read, cumulative

    def _read(self, pid: int, name: str) -> bytes:
        with open(f"{self.root}/{pid}/{name}", "rb") as handle:
            return handle.read()

    def _read_env(self, pid: int) -> dict[str, str]:
        try:
            return parse_environ(self._read(pid, "environ"))
        except OSError:
            return {}

    def _classify(self, pid: int, ino: int, old: _Entry | None, now: float) -> _Entry | None:
        try:
            raw = self._read(pid, "cmdline")
        except FileNotFoundError:
            return None  # gone between the listing and the read
        except OSError:
            self.read_errors += 1
            raw = b""
        same = old if old is not None and old.ino == ino else None
        fingerprint = hash(raw)
        if same is not None and same.argv_hash == fingerprint:
            raw = b""  # unchanged: recheck keeps the entry, as for an empty argv
        entry = recheck(
            same,
            parse_cmdline(raw),
            now,
            lambda: self._read_env(pid),
            lambda argv: _Entry(argv, ino=ino),
            self.classifier,
        )
        if entry is not same:
            entry.argv_hash = fingerprint
            if not entry.candidate:
                entry.cmdline = ()
        return entry

    def _ancestor_argv(self, pid: int, entry: _Entry) -> None:
        """An entry kept without its argv (no candidate) that a rule reads: read it again."""
        if entry.cmdline or entry.argv_hash is None:
            return
        try:
            raw = self._read(pid, "cmdline")
        except OSError:
            return
        if hash(raw) == entry.argv_hash:
            entry.cmdline = parse_cmdline(raw)

    def _stat(self, pid: int) -> Stat | None:
        try:
            return parse_stat(self._read(pid, "stat"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.read_errors += 1
            return None

    def _info(self, pid: int, entry: _Entry, stat: Stat) -> ProcessInfo:
        return ProcessInfo(
            pid=pid,
            ppid=stat.ppid,
            state=stat.state,
            cmdline=entry.cmdline,
            create_time=self._boot_time + stat.starttime / self._ticks,
            name=stat.comm,
            role=entry.role,
            env_loader=entry.env_loader(lambda: self._read_env(pid)),
        )

    def snapshot(self) -> list[ProcessInfo]:
        now = self.monotonic()
        cache = self._cache
        seen: dict[int, _Entry] = {}
        with os.scandir(self.root) as listing:
            for dirent in listing:
                name = dirent.name
                if not name.isdigit():
                    continue
                pid = int(name)
                try:
                    ino = dirent.inode()
                except OSError:
                    continue
                entry = cache.get(pid)
                if entry is None or entry.ino != ino or now >= entry.due:
                    entry = self._classify(pid, ino, entry, now)
                    if entry is None:
                        continue
                seen[pid] = entry
        self._cache = seen  # forgets processes that are gone

        infos: dict[int, ProcessInfo] = {}
        for pid, entry in seen.items():
            if not entry.candidate:
                continue
            stat = self._stat(pid)
            if stat is None:
                continue
            if entry.starttime is not None and entry.starttime != stat.starttime:
                # The same pid and inode but another process: classify afresh.
                fresh = self._classify(pid, -1, None, now)
                if fresh is None or not fresh.candidate:
                    continue
                fresh.ino = entry.ino
                seen[pid] = entry = fresh
            entry.starttime = stat.starttime
            infos[pid] = self._info(pid, entry, stat)

        # Ancestors: rules look for mlx.launch and sshd above a rank.
        pending = [info.ppid for info in infos.values()]
        while pending:
            pid = pending.pop()
            if pid <= 0 or pid in infos:
                continue
            entry = seen.get(pid)
            if entry is None:
                try:
                    ino = os.stat(f"{self.root}/{pid}").st_ino
                except OSError:
                    continue
                entry = self._classify(pid, ino, None, now)
                if entry is None:
                    continue
                seen[pid] = entry
            self._ancestor_argv(pid, entry)
            stat = self._stat(pid)
            if stat is None:
                continue
            infos[pid] = self._info(pid, entry, stat)
            pending.append(stat.ppid)

        if any(e.candidate and e.role is None for e in seen.values()):
            resolve_exo_runners(infos)
            for info in infos.values():  # remember what ancestry decided
                if info.role is Role.EXO_RUNNER:
                    seen[info.pid].role = Role.EXO_RUNNER
        return list(infos.values())
