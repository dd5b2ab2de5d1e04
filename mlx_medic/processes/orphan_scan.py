"""One node's orphan scan: a process-table snapshot -> the scoped processes and their
OrphanReport.

One piece of code for everyone who judges orphans on a node: the exporter's
`processes` collector (which keeps one scan between scrapes, so its caches pay off)
and the node helpers (`mlx-medic node orphans`, `sweep --orphans-only`), so what a
dashboard calls an orphan is what a sweep ends. The scan scopes each process with a
role to a model (cached per pid, start time and argv: a scope cannot change while
the argv does not), reads each rank's launch placement once while its temporary
hostfile is surely there, looks up each model's current run once per scan, and asks
the platform whether a process listens on a port and whether an sshd still has its
client (`mlx_medic.processes.orphans` holds the rules themselves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_medic.platform.listening import Probe, listening_probe
from mlx_medic.platform.process_files import read_process_file
from mlx_medic.processes.info import ProcessInfo, Role, State, by_pid
from mlx_medic.processes.orphans import (
    Established,
    Listening,
    OrphanReport,
    Scoped,
    find_orphans,
    psutil_established,
)
from mlx_medic.processes.placement import Placement, Reader, placement_of_env
from mlx_medic.processes.scope import ModelScoper
from mlx_medic.state.runs import read_current_run

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

ProcessReader = Callable[[ProcessInfo, str], str | None]  # a file as the process sees it


def read_as_process(proc: ProcessInfo, path: str) -> str | None:
    return read_process_file(proc.pid, path)


@dataclass(frozen=True)
class ScanResult:
    """What one snapshot shows: the processes in a model's scope, and the orphans among
    them (suspects apart). `probe` is the scan's listening probe, for callers that ask
    more of the same snapshot (the sweep's port guard)."""

    snapshot: list[ProcessInfo]
    scoped: list[Scoped]
    report: OrphanReport
    current_runs: dict[str, str | None]
    probe: Probe


class OrphanScan:
    """The snapshot -> OrphanReport pipeline, with the caches kept from scan to scan."""

    def __init__(
        self,
        *,
        node: str | None,
        inventory: Inventory | None,
        state_dir: Path,
        established: Established = psutil_established,
        listening: Callable[[], Probe] = listening_probe,  # a fresh probe per scan
        read_file: ProcessReader = read_as_process,
    ):
        self.node = node
        self.inventory = inventory
        self.state_dir = Path(state_dir)
        self.established = established
        self.listening = listening
        self.read_file = read_file
        self.scoper = ModelScoper(inventory)
        # A process's scope cannot change while its argv does not: cache it.
        self._scopes: dict[tuple[int, float, tuple[str, ...]], str | None] = {}
        # Nor its placement, read once when the rank is first seen: its temporary hostfile
        # may be cleaned away later.
        self._placements: dict[tuple[int, float], Placement | None] = {}

    def scope(self, snapshot: list[ProcessInfo]) -> list[Scoped]:
        scopes: dict[tuple[int, float, tuple[str, ...]], str | None] = {}
        found = []
        for proc in snapshot:
            if proc.role is None:
                continue
            key = (proc.pid, proc.create_time, proc.cmdline)
            model = self._scopes[key] if key in self._scopes else self.scoper.model_of(proc)
            scopes[key] = model
            if model is not None:
                found.append(Scoped(proc, model))
        self._scopes = scopes
        return found

    def placement_of(self, proc: ProcessInfo) -> Placement | None:
        key = (proc.pid, proc.create_time)
        if key not in self._placements:
            read: Reader = lambda path: self.read_file(proc, path)  # noqa: E731
            self._placements[key] = placement_of_env(proc.env, read)
        return self._placements[key]

    def _forget_placements(self, snapshot: list[ProcessInfo]) -> None:
        live = {(p.pid, p.create_time) for p in snapshot}
        for key in [k for k in self._placements if k not in live]:
            del self._placements[key]

    def scan(self, snapshot: list[ProcessInfo]) -> ScanResult:
        scoped = self.scope(snapshot)
        runs: dict[str, str | None] = {}

        def current_run(model: str) -> str | None:
            if model not in runs:
                runs[model] = read_current_run(self.state_dir, model)
            return runs[model]

        probe = self.listening()
        listening: Listening = lambda proc, port: probe(proc.pid, port)  # noqa: E731
        report = find_orphans(
            scoped,
            by_pid(snapshot),
            node=self.node or "",  # only read with an inventory, which always names the node
            inventory=self.inventory,
            current_run=current_run,
            established=self.established,
            listening=listening,
            placement_of=self.placement_of,
        )
        self._forget_placements(snapshot)
        for item in scoped:  # read while the temporary hostfile is surely there
            if item.role in (Role.RANK, Role.SHARE) and item.proc.state is not State.ZOMBIE:
                self.placement_of(item.proc)
        return ScanResult(snapshot, scoped, report, runs, probe)
