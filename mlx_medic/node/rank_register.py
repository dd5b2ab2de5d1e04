"""The JACCL ranks a node's rank guards watch, and how one that is gone is counted.

A JACCL rank that ends while its run is current, by no signal of ours, ended in a way
nobody can tell from a SIGKILL after the fact (a crash, an outside `kill -9`): the
ledger counts it as `vanished`, a spend on its devices (docs/decisions.md). Its guard
registers it here before the rank starts (`<state_dir>/runs/ranks/<pid>-<start>.json`:
model, run, devices), and whoever sees it gone first counts it: its own guard's watcher,
or any sweep on the node (which must read a true ledger right after a crash, before the
watcher's next look). A rank the ledger already knows (a sweep noted it before its
SIGTERM, a spend, a smoke test's cycle) is not counted again. Then the entry goes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.state.files import StateFileError, read_text_nofollow, write_text_atomic

START_TOLERANCE = 0.5  # seconds: two readings of one process's start time agree this well


@dataclass(frozen=True)
class Registered:
    model: str
    run_id: str
    pid: int
    start_time: float
    devices: tuple[str, ...]
    path: Path


def register_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "runs" / "ranks"


def register(
    state_dir: Path,
    *,
    model: str,
    run_id: str,
    pid: int,
    start_time: float,
    devices: tuple[str, ...],
) -> Path:
    """Note a JACCL rank before it starts."""
    path = register_dir(state_dir) / f"{pid}-{int(start_time * 1000)}.json"
    write_text_atomic(
        path,
        json.dumps(
            {
                "model": model,
                "run_id": run_id,
                "pid": pid,
                "start_time": start_time,
                "devices": list(devices),
            }
        ),
    )
    return path


def registered(state_dir: Path) -> list[Registered]:
    """Every registered rank; an entry that cannot be read is skipped (and left)."""
    found: list[Registered] = []
    try:
        names = sorted(os.listdir(register_dir(state_dir)))
    except OSError:
        return found
    for name in names:
        path = register_dir(state_dir) / name
        try:
            data = json.loads(read_text_nofollow(path) or "")
            found.append(
                Registered(
                    str(data["model"]),
                    str(data["run_id"]),
                    int(data["pid"]),
                    float(data["start_time"]),
                    tuple(str(d) for d in data.get("devices", ())),
                    path,
                )
            )
        except (StateFileError, ValueError, KeyError, TypeError):
            continue
    return found


def _alive(pid: int, start_time: float) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
        return (
            process.status() != psutil.STATUS_ZOMBIE
            and abs(process.create_time() - start_time) <= START_TOLERANCE
        )
    except psutil.Error:
        return False


def count_gone(
    state_dir: Path, node: str, *, alive: Callable[[int, float], bool] = _alive
) -> list[Registered]:
    """Count every registered rank that is gone and that the ledger does not know as
    `vanished`; forget every gone one. Returns those counted."""
    from mlx_medic.state.ledger import LedgerError, read_ledger, record_spend

    counted = []
    for rank in registered(state_dir):
        if alive(rank.pid, rank.start_time):
            continue
        try:
            ledger = read_ledger(state_dir, node)
            known = any(
                e.pid == rank.pid and abs(e.start_time - rank.start_time) <= START_TOLERANCE
                for e in ledger.entries
            )
            if not known and record_spend(
                state_dir,
                node,
                "vanished",
                pid=rank.pid,
                start_time=rank.start_time,
                devices=rank.devices,
                model=rank.model,
            ):
                counted.append(rank)
        except LedgerError:
            continue  # counted at the next look, when the ledger reads again
        rank.path.unlink(missing_ok=True)
    return counted
