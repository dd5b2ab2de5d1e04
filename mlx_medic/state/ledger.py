"""The protection-domain ledger: what this node has spent since it booted, per RDMA device.

JACCL spends one protection domain per RDMA device a rank uses (one per peer device of a
mesh rank; about 11 per device, docs/decisions.md). A domain that a rank held when it was
SIGKILLed, or when it ended with nothing of ours ending it, is counted as spent until
reboot; a survivor of SIGKILL holds its devices' domains while it lives. The ledger counts
those so a start can stop at the model's reserve (`policy.pd_reserve`, after dryvist/nix-ai's
cap of 5 of 11, kept per device) while the node can still run.

Kept on the node (`<state_dir>/pd-ledger.json`), written by whoever spends under a file
lock and replaced atomically, so a reader never sees half a file; never read or written
through a symlink. It is per boot: a ledger from another boot is empty.

Entry kinds:

- counted (debt): `sigkill` (a JACCL rank this node SIGKILLed), `vanished` (a JACCL rank
  that ended while its run was current with no signal of ours: its exit cannot be told
  from a SIGKILL after the fact), `unkillable` (a survivor of SIGKILL in uninterruptible
  sleep, with its command line, backend and whether it holds the model's port). One spend
  per process: an identity (pid, start time) counts once across these kinds, on the union
  of its entries' devices. An entry whose backend is known not to be JACCL (`ring`,
  `none`) is recorded (an unkillable launcher or ring rank is a survivor all the same) but
  spends nothing.
- disputed (shown, never debt): `init_teardown` (a JACCL init and clean teardown) and
  `failed_start` (a failed JACCL init: the device that refused gave nothing, and what the
  init had taken on its other devices was given back by the unwind, the same path as a
  clean teardown; docs/decisions.md).
- bookkeeping (never debt, not a cycle): `ended`, written by a sweep before its SIGTERM
  reaches a JACCL rank, so the rank's guard, seeing it gone, knows a signal of ours ended
  it (`has_entry`).

Per device: a spend with devices counts one domain on each; a spend whose devices are
unknown counts against every device of the node (`NODE_UNIT` in `debt_by_unit`, added to
each device by `device_debt`). A JACCL start may be tried while every device it needs is
below the reserve (`jaccl_allowed`).

One module at about 470 lines: the entry kinds, the per-device debt and the file's lock
and format are one contract that every writer and reader shares.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.node.record_lock import exclusive
from mlx_medic.processes.survivors import Survivor
from mlx_medic.state.files import StateFileError, read_text_nofollow, write_text_atomic

SCHEMA = 2  # 2: vanished, unkillable, ended; failed_start disputed; per-entry survivor facts
READABLE_SCHEMAS = (1, 2)  # a schema-1 file (sigkill, failed_start, init_teardown) still reads
LEDGER_FILE = "pd-ledger.json"
LOCK_FILE = "pd-ledger.lock"
NODE_UNIT = "node"  # the unit a spend counts against when its devices are unknown

EntryKind = Literal["sigkill", "vanished", "unkillable", "failed_start", "init_teardown", "ended"]
COUNTED_KINDS = ("sigkill", "vanished", "unkillable")  # debt, once per process
DISPUTED_KINDS = ("failed_start", "init_teardown")  # shown, never debt
ENDED_KIND = "ended"  # bookkeeping: a signal of ours is about to end this rank
ENTRY_KINDS = (*COUNTED_KINDS, *DISPUTED_KINDS, ENDED_KIND)
NOT_JACCL = ("ring", "none")  # backends whose processes hold no JACCL domain
# A process's start time as its process table computes it (Linux: boot time plus clock
# ticks; macOS: psutil) and as psutil reads it: one formula, so the slack that
# mlx_medic/platform/process_identity.py allows (5 ms, half a tick) covers float rounding.
START_TOLERANCE = 0.005
# Entries that are no debt are kept to a bound, newest first, so a restart loop cannot grow
# the file past what a reader accepts: a guard reads its `ended` note within seconds, and
# disputed cycles dropped are still counted (`cycles_dropped`).
MAX_ENDED = 1024
MAX_DISPUTED = 256


class LedgerError(RuntimeError):
    """The ledger file cannot be read or written; the message names it and why."""


@dataclass(frozen=True)
class Entry:
    kind: str  # one of ENTRY_KINDS
    pid: int
    start_time: float  # the process's start time: with the pid, its identity
    devices: tuple[str, ...] = ()  # empty: unknown, counted against every device
    model: str | None = None
    at: float = 0.0  # when it was recorded (seconds since the epoch)
    cmdline: tuple[str, ...] = ()
    backend: str | None = None  # jaccl | ring | none | unknown; None: not said
    holds_port: bool = False  # a survivor listening on the model's port

    @property
    def disputed(self) -> bool:
        return self.kind in DISPUTED_KINDS

    @property
    def counted(self) -> bool:
        """Debt: a counted kind of a process that may hold JACCL domains."""
        return self.kind in COUNTED_KINDS and self.backend not in NOT_JACCL

    def same_process(self, pid: int, start_time: float) -> bool:
        return self.pid == pid and abs(self.start_time - start_time) < START_TOLERANCE

    def survivor(self, node: str) -> Survivor:
        """An `unkillable` entry as the shared survivor policy reads one."""
        return Survivor(
            node=node,
            pid=self.pid,
            start_time=self.start_time,
            cmdline=self.cmdline,
            role="?",
            state="uninterruptible",
            model=self.model or "",
            backend=self.backend or "unknown",
            devices=self.devices,
            holds_port=self.holds_port,
        )

    def to_record(self) -> dict[str, Any]:
        """As the file keeps it: optional facts only when said."""
        record: dict[str, Any] = {
            "kind": self.kind,
            "pid": self.pid,
            "start_time": self.start_time,
            "devices": list(self.devices),
            "model": self.model,
            "at": self.at,
        }
        if self.cmdline:
            record["cmdline"] = list(self.cmdline)
        if self.backend is not None:
            record["backend"] = self.backend
        if self.holds_port:
            record["holds_port"] = True
        return record

    def to_json(self) -> dict[str, Any]:
        """As `mlx-medic node ledger --json` shows it: every field, and how it counts."""
        return {
            "kind": self.kind,
            "pid": self.pid,
            "start_time": self.start_time,
            "devices": list(self.devices),
            "model": self.model,
            "at": self.at,
            "cmdline": list(self.cmdline),
            "backend": self.backend,
            "holds_port": self.holds_port,
            "disputed": self.disputed,
            "counted": self.counted,
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Entry:
        kind = str(data["kind"])
        if kind not in ENTRY_KINDS:
            raise ValueError(f"entry kind {kind!r}")
        backend = data.get("backend")
        return cls(
            kind=kind,
            pid=int(data["pid"]),
            start_time=float(data["start_time"]),
            devices=tuple(str(d) for d in data.get("devices", ())),
            model=None if data.get("model") is None else str(data["model"]),
            at=float(data.get("at", 0.0)),
            cmdline=tuple(str(w) for w in data.get("cmdline", ())),
            backend=None if backend is None else str(backend),
            holds_port=bool(data.get("holds_port", False)),
        )


@dataclass(frozen=True)
class Spend:
    """One counted process: its identity, the union of its entries' devices (empty:
    unknown), and the kinds it was recorded as."""

    pid: int
    start_time: float
    devices: tuple[str, ...]
    kinds: tuple[str, ...]


@dataclass
class Ledger:
    node: str
    boot_id: str
    entries: list[Entry] = field(default_factory=list)
    cycles_dropped: int = 0  # disputed cycles no longer kept in the file (MAX_DISPUTED)

    @property
    def spends(self) -> list[Entry]:
        """The counted entries (several may be one process: see `processes`)."""
        return [entry for entry in self.entries if entry.counted]

    def processes(self) -> list[Spend]:
        """One spend per counted process, in the order first recorded."""
        found: list[tuple[int, float, list[str], list[str]]] = []
        for entry in self.spends:
            group = next((g for g in found if entry.same_process(g[0], g[1])), None)
            if group is None:
                group = (entry.pid, entry.start_time, [], [])
                found.append(group)
            group[2].extend(d for d in entry.devices if d not in group[2])
            if entry.kind not in group[3]:
                group[3].append(entry.kind)
        return [
            Spend(pid, start, tuple(devices), tuple(kinds)) for pid, start, devices, kinds in found
        ]

    @property
    def debt(self) -> int:
        """Processes counted this boot: the node's total, whatever their devices."""
        return len(self.processes())

    def debt_by_unit(self) -> dict[str, int]:
        """Counted processes per RDMA device (`node` for those whose devices are unknown,
        which count against every device: see `device_debt`)."""
        units: dict[str, int] = {}
        for spend in self.processes():
            for unit in spend.devices or (NODE_UNIT,):
                units[unit] = units.get(unit, 0) + 1
        return units

    @property
    def disputed_cycles(self) -> int:
        """Disputed init/teardown cycles and failed starts, once per process."""
        seen: list[tuple[str, int, float]] = []
        for entry in self.entries:
            if entry.disputed and not any(
                k == entry.kind and entry.same_process(p, s) for k, p, s in seen
            ):
                seen.append((entry.kind, entry.pid, entry.start_time))
        return len(seen) + self.cycles_dropped

    @property
    def survivors(self) -> list[Entry]:
        """The `unkillable` entries, live or not (see `live_survivors`)."""
        return [entry for entry in self.entries if entry.kind == "unkillable"]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "node": self.node,
            "boot_id": self.boot_id,
            "entries": [entry.to_record() for entry in self.entries],
        }
        if self.cycles_dropped:
            data["cycles_dropped"] = self.cycles_dropped
        return data


# --- the per-device rule (pure: the ledger helper and the serve wrapper use it) ------------


def _units(ledger_or_units: Ledger | Mapping[str, int]) -> Mapping[str, int]:
    if isinstance(ledger_or_units, Ledger):
        return ledger_or_units.debt_by_unit()
    return ledger_or_units


def device_debt(units: Mapping[str, int], device: str) -> int:
    """Domains spent on `device`: the spends that name it and those whose devices are
    unknown (which count against every device)."""
    unknown = units.get(NODE_UNIT, 0)
    return unknown if device == NODE_UNIT else units.get(device, 0) + unknown


def debt_by_device(units: Mapping[str, int], devices: Iterable[str] = ()) -> dict[str, int]:
    """Each known device's debt (`device_debt`), sorted: the devices the spends name and
    `devices` (e.g. those the node's models use, from their hostfiles). With no device
    known at all: `{"node": spends of unknown devices}` alone."""
    known = sorted({*devices, *(unit for unit in units if unit != NODE_UNIT)})
    if not known:
        return {NODE_UNIT: units.get(NODE_UNIT, 0)}
    return {device: device_debt(units, device) for device in known}


def start_debt(ledger_or_units: Ledger | Mapping[str, int], devices: Sequence[str] = ()) -> int:
    """The debt a start is judged by: the highest among the devices it needs; with none
    known, the busiest device the ledger knows (or its unknown-device spends)."""
    units = _units(ledger_or_units)
    if devices:
        return max(device_debt(units, device) for device in devices)
    return max(debt_by_device(units).values())


def jaccl_allowed(
    ledger_or_units: Ledger | Mapping[str, int], reserve: int, devices: Sequence[str] = ()
) -> bool:
    """Whether a JACCL start may be tried here: every device it needs (`devices`) has
    debt below `reserve`; with no devices known, the busiest one has. Never at reserve 0."""
    return start_debt(ledger_or_units, devices) < reserve


def has_entry(ledger: Ledger, pid: int, start_time: float) -> bool:
    """Whether the ledger has any entry (any kind) for this process."""
    return any(entry.same_process(pid, start_time) for entry in ledger.entries)


def process_alive(pid: int, start_time: float) -> bool:
    """Whether `pid` still names the process that started at `start_time` (psutil's start
    time, as the process tables compute it, within START_TOLERANCE); a zombie is gone. A
    process whose start cannot be read (access denied) is taken as alive."""
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            return abs(process.create_time() - start_time) < START_TOLERANCE
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False


def live_survivors(
    ledger: Ledger, alive: Callable[[int, float], bool] = process_alive
) -> list[Entry]:
    """The `unkillable` entries whose process still lives on this node, once each."""
    found: list[Entry] = []
    for entry in ledger.survivors:
        if not any(e.same_process(entry.pid, entry.start_time) for e in found) and alive(
            entry.pid, entry.start_time
        ):
            found.append(entry)
    return found


# --- the file ------------------------------------------------------------------------------


def ledger_path(state_dir: Path) -> Path:
    return Path(state_dir) / LEDGER_FILE


def _parse(path: Path, text: str, node: str) -> tuple[str, list[Entry], int]:
    try:
        data = json.loads(text)
        if data.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(
                f"schema {data.get('schema')!r}, expected one of"
                f" {', '.join(map(str, READABLE_SCHEMAS))}"
            )
        if data.get("node") != node:
            raise ValueError(f"it is node {data.get('node')!r}'s ledger, not {node!r}'s")
        entries = [Entry.from_record(e) for e in data["entries"]]
        return str(data["boot_id"]), entries, int(data.get("cycles_dropped", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(
            f"{path} is not a readable ledger ({exc}); it is left as it is: move it aside"
            " to start an empty one"
        ) from None


def read_ledger(state_dir: Path, node: str, boot_id: str | None = None) -> Ledger:
    """This boot's ledger; empty when there is none or it is from another boot."""
    boot = boot_id or current_boot_id()
    path = ledger_path(state_dir)
    try:
        text = read_text_nofollow(path)
    except StateFileError as exc:
        raise LedgerError(str(exc)) from None
    if text is None:
        return Ledger(node, boot)
    stored_boot, entries, dropped = _parse(path, text, node)
    if stored_boot != boot:
        return Ledger(node, boot)
    return Ledger(node, boot, entries, dropped)


@contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One read-judge-write of the ledger at a time; waits as long as another takes (a
    spend is never dropped for want of the lock)."""
    with ExitStack() as stack:
        try:
            stack.enter_context(exclusive(Path(state_dir) / LOCK_FILE, wait=None))
        except StateFileError as exc:
            raise LedgerError(str(exc)) from None
        yield


def _bound(ledger: Ledger) -> None:
    """Keep the newest MAX_ENDED `ended` and MAX_DISPUTED disputed entries; count the
    disputed ones dropped. Debt is never dropped."""
    ended = [e for e in ledger.entries if e.kind == ENDED_KIND]
    disputed = [e for e in ledger.entries if e.disputed]
    drop = {id(e) for e in ended[: max(0, len(ended) - MAX_ENDED)]}
    drop |= {id(e) for e in disputed[: max(0, len(disputed) - MAX_DISPUTED)]}
    if not drop:
        return
    before = ledger.disputed_cycles
    ledger.entries = [e for e in ledger.entries if id(e) not in drop]
    ledger.cycles_dropped += before - ledger.disputed_cycles


def _write(state_dir: Path, ledger: Ledger) -> None:
    _bound(ledger)
    try:
        write_text_atomic(ledger_path(state_dir), json.dumps(ledger.to_json(), indent=1))
    except StateFileError as exc:
        raise LedgerError(str(exc)) from None


def record_spend(
    state_dir: Path,
    node: str,
    kind: EntryKind,
    *,
    pid: int,
    start_time: float,
    devices: Sequence[str] = (),
    model: str | None = None,
    boot_id: str | None = None,
    clock: Callable[[], float] = time.time,
    cmdline: Sequence[str] = (),
    backend: str | None = None,
    holds_port: bool = False,
) -> bool:
    """Record an entry of `kind` for this process (pid and start time), once per kind.

    Counted kinds (`sigkill`, `vanished`, `unkillable`): True when the process is new debt,
    False when it was already counted (the entry is still written when its kind is new for
    the process: a frozen rank SIGKILLed and then recorded unkillable is one spend, the
    survivor's facts kept) or when this kind is already recorded for it. Other kinds, and
    a counted kind of a backend that holds no JACCL domain: True when written, False when
    this kind is already recorded for the process."""
    if kind not in ENTRY_KINDS:
        raise ValueError(f"{kind!r} is not a ledger entry (one of {', '.join(ENTRY_KINDS)})")
    entry = Entry(
        kind, pid, start_time, tuple(devices), model, clock(), tuple(cmdline), backend, holds_port
    )
    with _locked(state_dir):
        ledger = read_ledger(state_dir, node, boot_id)
        same = [e for e in ledger.entries if e.same_process(pid, start_time)]
        if any(e.kind == kind for e in same):
            return False
        was_counted = any(e.counted for e in same)
        ledger.entries.append(entry)
        _write(state_dir, ledger)
        return not was_counted if entry.counted else True


def record_ended(
    state_dir: Path,
    node: str,
    processes: Sequence[tuple[int, float, str | None, Sequence[str]]],
    *,
    boot_id: str | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """Before a sweep's SIGTERM reaches them: note that a signal of ours ends these JACCL
    ranks (pid, start time, model, devices), in one write. Never debt. Returns how many
    were new (a process already noted is noted once)."""
    if not processes:
        return 0
    now = clock()
    with _locked(state_dir):
        ledger = read_ledger(state_dir, node, boot_id)
        noted = [e for e in ledger.entries if e.kind == ENDED_KIND]
        added = 0
        for pid, start_time, model, devices in processes:
            if any(e.same_process(pid, start_time) for e in noted):
                continue
            entry = Entry(ENDED_KIND, int(pid), float(start_time), tuple(devices), model, now)
            ledger.entries.append(entry)
            noted.append(entry)
            added += 1
        if added:
            _write(state_dir, ledger)
        return added
