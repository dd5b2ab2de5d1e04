"""The macOS process table: psutil for the table, `ps` for the state.

psutil cannot report uninterruptible wait on macOS (it reads `p_stat`, which
is SRUN for nearly every live process), but the seed's orphans are exactly
the `Us+` ones. `ps` (which holds the task-port entitlement) computes the
state from thread run states, so state comes from `ps -axo pid=,ppid=,stat=`.
The parser is tested on verbatim macOS lines in tests/fixtures/macos/.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from mlx_medic.log_on_use import logger
from mlx_medic.platform.command_lines import CachedCommand, recheck
from mlx_medic.processes.info import WATCHED_ENV, ProcessInfo, Role, State
from mlx_medic.processes.roles import Classifier, classify, resolve_exo_runners

LOGGER = __name__  # mlx_medic.log_on_use: logging is imported when it logs

PS_COMMAND = ("/bin/ps", "-axo", "pid=,ppid=,stat=")

# First character of a macOS `ps` state (adv_cmds ps/print.c state(): T and Z
# from p_stat, else the minimum thread state from " RUSITH?").
PS_STATE_LETTERS: dict[str, State] = {
    "R": State.RUNNING,
    "U": State.UNINTERRUPTIBLE,
    "S": State.SLEEPING,
    "I": State.SLEEPING,  # idle: asleep for more than about 20 seconds
    "T": State.STOPPED,
    "Z": State.ZOMBIE,
    "H": State.ZOMBIE,  # every thread halted: the process is exiting
    "D": State.UNINTERRUPTIBLE,  # procps spelling, for `ps` output from Linux
    "X": State.ZOMBIE,
}

# psutil's own status, trusted on macOS only for zombie and stopped.
_PSUTIL_STATES = {psutil.STATUS_ZOMBIE: State.ZOMBIE, psutil.STATUS_STOPPED: State.STOPPED}


# A whole `stat` word: the run state, then flags from print.c state() (and
# procps's extra `l`), e.g. `Us+`, `U<s`, `Ss`, `R+`.
PS_STAT_WORD = re.compile(r"^[RUSITHZD?X][<>+ANELsSVWXl]*$")


class PsParseError(ValueError):
    pass


def parse_ps_stat(stat: str) -> State | None:
    """`Us+` -> uninterruptible, `Ss` -> sleeping, ...; None for `?` (no task port)."""
    stat = stat.strip()
    if not PS_STAT_WORD.match(stat):
        raise PsParseError(f"{stat!r} is not a ps state")
    letter = stat[0]
    if letter == "?":
        return None
    try:
        return PS_STATE_LETTERS[letter]
    except KeyError:
        raise PsParseError(f"unknown ps state {stat!r}") from None


@dataclass(frozen=True)
class PsRow:
    pid: int
    ppid: int
    stat: str
    state: State | None


def parse_ps_axo(text: str) -> dict[int, PsRow]:
    """Rows of `ps -axo pid=,ppid=,stat=`; lines that do not parse are skipped."""
    rows: dict[int, PsRow] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        try:
            state = parse_ps_stat(parts[2])
        except PsParseError:
            logger(LOGGER).debug("skipping ps line with an unknown state: %r", line)
            continue
        rows[int(parts[0])] = PsRow(int(parts[0]), int(parts[1]), parts[2], state)
    return rows


def run_ps() -> str:
    return subprocess.run(PS_COMMAND, capture_output=True, text=True, check=True, timeout=10).stdout


class MacProcessTable:
    """`ProcessTable` for macOS; `ps` and psutil are injectable for tests."""

    def __init__(
        self,
        ps: Callable[[], str] = run_ps,
        process_iter: Callable[..., Iterable[psutil.Process]] = psutil.process_iter,
        monotonic: Callable[[], float] = time.monotonic,
        classifier: Classifier = classify,
    ):
        self.ps = ps
        self.process_iter = process_iter
        self.monotonic = monotonic
        self.classifier = classifier
        self._cache: dict[tuple[int, float], CachedCommand] = {}

    @staticmethod
    def _env_of(proc: psutil.Process) -> dict[str, str]:
        try:
            environ = proc.environ()
        except (psutil.Error, OSError):
            return {}
        return {key: environ[key] for key in WATCHED_ENV if key in environ}

    def _classify(
        self, proc: psutil.Process, old: CachedCommand | None, now: float
    ) -> CachedCommand:
        try:
            cmdline = tuple(proc.cmdline())
        except (psutil.Error, OSError):
            cmdline = ()
        return recheck(
            old, cmdline, now, lambda: self._env_of(proc), CachedCommand, self.classifier
        )

    def snapshot(self) -> list[ProcessInfo]:
        now = self.monotonic()
        rows = parse_ps_axo(self.ps())
        listed: dict[int, tuple[psutil.Process, CachedCommand, float, str]] = {}
        seen: dict[tuple[int, float], CachedCommand] = {}
        for proc in self.process_iter(["pid", "ppid", "name", "create_time", "status"]):
            info = proc.info  # type: ignore[attr-defined]
            if info.get("pid") is None or info.get("create_time") is None:
                continue
            key = (info["pid"], info["create_time"])
            entry = self._cache.get(key)
            if entry is None or now >= entry.due:
                entry = self._classify(proc, entry, now)
            seen[key] = entry
            listed[info["pid"]] = (proc, entry, info["create_time"], info.get("name") or "")
        self._cache = seen

        infos: dict[int, ProcessInfo] = {}

        def add(pid: int) -> ProcessInfo | None:
            if pid in infos or pid not in listed:
                return infos.get(pid)
            proc, entry, created, name = listed[pid]
            row = rows.get(pid)
            ppid = row.ppid if row else (proc.info.get("ppid") or 0)  # type: ignore[attr-defined]
            state = row.state if row else None
            if state is None:
                status = proc.info.get("status")  # type: ignore[attr-defined]
                state = _PSUTIL_STATES.get(str(status), State.SLEEPING)
            infos[pid] = ProcessInfo(
                pid=pid,
                ppid=ppid,
                state=state,
                cmdline=entry.cmdline,
                create_time=created,
                name=name,
                role=entry.role,
                env_loader=entry.env_loader(lambda: self._env_of(proc)),
            )
            return infos[pid]

        for pid, (_proc, entry, _created, _name) in listed.items():
            if not entry.candidate:
                continue
            found = add(pid)
            while found is not None and found.ppid > 0 and found.ppid not in infos:
                found = add(found.ppid)
        resolve_exo_runners(infos)
        for known in infos.values():  # remember what ancestry decided, as on Linux
            if known.role is Role.EXO_RUNNER and known.pid in listed:
                listed[known.pid][1].role = Role.EXO_RUNNER
        return list(infos.values())
