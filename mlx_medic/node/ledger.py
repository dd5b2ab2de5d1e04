"""The protection-domain ledger: what this node has spent since it booted.

A SIGKILLed JACCL rank or a failed JACCL start leaves its protection domains allocated
until reboot (about 11 per RDMA device; docs/decisions.md), so a restart loop can fill a
device and then no JACCL start works until someone reboots. The ledger counts those
spends so a start can stop at the model's reserve (`policy.pd_reserve`, after
dryvist/nix-ai's cap of 5 of 11) while the node can still run.

Kept on the node (`<state_dir>/pd-ledger.json`), written by whoever spends under a file
lock and replaced atomically, so a reader never sees half a file. It is per boot: a
ledger from another boot is empty. A process is recorded once per identity (pid and start
time): a frozen rank signalled again at every restart is one spend. Each spend names the
RDMA devices of the rank's `MLX_IBV_DEVICES` row when known, else none (the node). JACCL
init/teardown cycles are recorded apart and marked disputed: the seeds disagree on
whether a clean teardown leaks, so they are shown, never counted as debt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlx_medic.node.boot_id import current_boot_id
from mlx_medic.node.record_lock import exclusive
from mlx_medic.state_files import StateFileError, read_text_nofollow, write_text_atomic

SCHEMA = 1
LEDGER_FILE = "pd-ledger.json"
LOCK_FILE = "pd-ledger.lock"
NODE_UNIT = "node"  # the unit a spend counts against when its devices are unknown

EntryKind = Literal["sigkill", "failed_start", "init_teardown"]
SPEND_KINDS = ("sigkill", "failed_start")
CYCLE_KIND = "init_teardown"  # disputed: shown, never counted as debt
ENTRY_KINDS = (*SPEND_KINDS, CYCLE_KIND)


class LedgerError(RuntimeError):
    """The ledger file cannot be read or written; the message names it and why."""


@dataclass(frozen=True)
class Entry:
    kind: str  # one of ENTRY_KINDS
    pid: int
    start_time: float  # the process's start time: with the pid, its identity
    devices: tuple[str, ...] = ()  # empty: unknown, counted against the node
    model: str | None = None
    at: float = 0.0  # when it was recorded (seconds since the epoch)

    @property
    def disputed(self) -> bool:
        return self.kind == CYCLE_KIND

    def same_process(self, pid: int, start_time: float) -> bool:
        return self.pid == pid and self.start_time == start_time

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices), "disputed": self.disputed}


@dataclass
class Ledger:
    node: str
    boot_id: str
    entries: list[Entry] = field(default_factory=list)

    @property
    def spends(self) -> list[Entry]:
        return [entry for entry in self.entries if not entry.disputed]

    @property
    def debt(self) -> int:
        """Domains spent this boot, counted per node: every spend, whatever its device."""
        return len(self.spends)

    def debt_by_unit(self) -> dict[str, int]:
        """Spends per RDMA device (`node` for spends whose devices are unknown)."""
        units: dict[str, int] = {}
        for entry in self.spends:
            for unit in entry.devices or (NODE_UNIT,):
                units[unit] = units.get(unit, 0) + 1
        return units

    @property
    def disputed_cycles(self) -> int:
        return len(self.entries) - len(self.spends)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "node": self.node, "boot_id": self.boot_id,
            "entries": [entry.to_json() for entry in self.entries],
        }  # fmt: skip


def jaccl_allowed(ledger: Ledger, reserve: int) -> bool:
    """Whether a JACCL start may be tried on this node: no once `reserve` domains are spent."""
    return ledger.debt < reserve


def ledger_path(state_dir: Path) -> Path:
    return Path(state_dir) / LEDGER_FILE


def _parse(path: Path, text: str, node: str) -> tuple[str, list[Entry]]:
    try:
        data = json.loads(text)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
        if data.get("node") != node:
            raise ValueError(f"it is node {data.get('node')!r}'s ledger, not {node!r}'s")
        entries = [
            Entry(kind=str(e["kind"]), pid=int(e["pid"]), start_time=float(e["start_time"]),
                  devices=tuple(str(d) for d in e.get("devices", ())),
                  model=e.get("model"), at=float(e.get("at", 0.0)))
            for e in data["entries"]
        ]  # fmt: skip
        return str(data["boot_id"]), entries
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
    stored_boot, entries = _parse(path, text, node)
    return Ledger(node, boot, entries if stored_boot == boot else [])


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


def _write(state_dir: Path, ledger: Ledger) -> None:
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
) -> bool:
    """Record a SIGKILLed JACCL rank or a failed JACCL start (debt), or a JACCL init and
    clean teardown (`init_teardown`: disputed, never debt). False when this process (pid
    and start time) is already recorded so this boot: a spend once, a cycle once."""
    if kind not in ENTRY_KINDS:
        raise ValueError(f"{kind!r} is not a ledger entry (one of {', '.join(ENTRY_KINDS)})")
    entry = Entry(kind, pid, start_time, tuple(devices), model, clock())
    with _locked(state_dir):
        ledger = read_ledger(state_dir, node, boot_id)
        if any(e.disputed == entry.disputed and e.same_process(pid, start_time)
               for e in ledger.entries):  # fmt: skip
            return False
        ledger.entries.append(entry)
        _write(state_dir, ledger)
        return True
