"""What a sweep found and did: each target (its identity, role, backend and devices, and
how it ended), the processes it spared and why, the ones not ours to end, and the
survivors it leaves, as the JSON document `mlx-medic node sweep` emits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_medic.node.sweep_scope import Mode, backend_of
from mlx_medic.platform.process_identity import Identity
from mlx_medic.processes.info import ProcessInfo, State
from mlx_medic.processes.not_ours import owner_fields
from mlx_medic.processes.survivors import Survivor


@dataclass
class Target:
    proc: ProcessInfo
    rule: str | None = None
    signals: list[str] = field(default_factory=list)
    state: State | None = None  # last seen, for survivors
    holds_port: bool = False  # listens on the model's port
    devices: tuple[str, ...] = ()  # a JACCL rank's RDMA devices, read when listed
    foreign: bool = False  # a signal was refused (EPERM): another user's, not ours

    @property
    def role(self) -> str:
        return str(self.proc.role)

    def same(self, identity: Identity | None) -> bool:
        return identity is not None and identity.same_process(
            self.proc.pid, self.proc.create_time, self.proc.cmdline
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid,
            "start_time": self.proc.create_time,
            "cmdline": list(self.proc.cmdline),
            "role": self.role,
            "rule": self.rule,
            "signals": list(self.signals),
        }

    def survivor_json(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid,
            "start_time": self.proc.create_time,
            "cmdline": list(self.proc.cmdline),
            "role": self.role,
            "state": str(self.state or self.proc.state),
        }

    def survivor(self, node: str, model: str) -> Survivor:
        return Survivor(
            node=node,
            pid=self.proc.pid,
            start_time=self.proc.create_time,
            cmdline=tuple(self.proc.cmdline),
            role=self.role,
            state=str(self.state or self.proc.state),
            model=model,
            backend=backend_of(self.proc),
            devices=self.devices,
            holds_port=self.holds_port,
        )


@dataclass
class SweepReport:
    model: str
    node: str
    mode: Mode
    run_id: str | None
    dry_run: bool
    targets: list[Target] = field(default_factory=list)
    exited: list[int] = field(default_factory=list)
    survivors: list[Target] = field(default_factory=list)
    spared: list[dict[str, Any]] = field(default_factory=list)
    pd_spent: int = 0
    listeners_signalled: list[int] = field(default_factory=list)  # hung ones, or its run's
    serving_listener: dict[str, Any] | None = None  # start sweep: an answering listener
    not_ours: list[dict[str, Any]] = field(default_factory=list)  # may not signal: left alone
    grace_waited: float = 0.0  # seconds of SIGTERM grace waited out (something outlived it)

    @property
    def unkillable(self) -> list[Target]:
        return [s for s in self.survivors if s.state is State.UNINTERRUPTIBLE]

    @property
    def complete(self) -> bool:
        return not self.survivors

    @property
    def settled(self) -> bool:
        """Nothing survived, or only what no sweep can end and no start needs: a start may
        go on around it."""
        return all(s.state is State.UNINTERRUPTIBLE and not s.holds_port for s in self.survivors)

    def spare(self, proc: ProcessInfo, reason: str) -> None:
        self.spared.append({"pid": proc.pid, "cmdline": list(proc.cmdline), "reason": reason})

    def foreign(self, proc: ProcessInfo, uid: int | None, holds_port: bool, why: str) -> None:
        """Another user's process this helper may not signal: named, never ended."""
        self.not_ours.append(
            {
                "pid": proc.pid,
                "start_time": proc.create_time,
                "cmdline": list(proc.cmdline),
                "role": str(proc.role),
                **owner_fields(uid),
                "holds_port": holds_port,
                "why": why,
            }
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "node": self.node,
            "mode": str(self.mode),
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            "signalled": [t.to_json() for t in self.targets if t.signals or self.dry_run],
            "exited": self.exited,
            "survivors": [s.survivor_json() for s in self.survivors],
            "unkillable": [s.survivor(self.node, self.model).to_json() for s in self.unkillable],
            "spared": self.spared,
            "pd_spent": self.pd_spent,
            "complete": self.complete,
            "settled": self.settled,
            "listeners_signalled": self.listeners_signalled,
            "serving_listener": self.serving_listener,
            "not_ours": self.not_ours,
            "grace_waited": round(self.grace_waited, 3),
        }
