"""The survivor policy: what a sweep could not end, and what a start does about it.

Seed 000's final fix: "those already in Us+ survive but stop accumulating". A process in
uninterruptible sleep (`D` on Linux, `U` on macOS) survives SIGKILL until its node
reboots; it holds the protection domains of its RDMA devices while it lives. So a
survivor is recorded (the sweep writes it into its node's ledger, once per process),
named with the one action that frees it (reboot its node), and the start goes on around
it: JACCL while the ledger leaves every device the start needs room, else ring. Only a
survivor that holds what no start can do without, the model's port on the node that
must listen on it, stops the start.

One module for `node sweep` (`survivors_of`), `mlx-medic serve` (`serve/nodes.py`) and
the remediator's sweep step (both through `node.sweep_reply.SweepReply`), so all three
judge survivors alike and say the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory


@dataclass(frozen=True)
class Survivor:
    """One process a sweep could not end, as its node's sweep reported it."""

    node: str
    pid: int
    start_time: float
    cmdline: tuple[str, ...]
    role: str
    state: str
    model: str
    backend: str = "unknown"  # jaccl | ring | none (no rank) | unknown
    devices: tuple[str, ...] = ()  # its RDMA devices (MLX_IBV_DEVICES row); () unknown
    holds_port: bool = False  # listens on the model's port on its node

    @property
    def domains(self) -> int:
        """Protection domains it is believed to hold: one per RDMA device of a JACCL rank
        (at least one when its devices are unknown), none for anything else."""
        if self.backend != "jaccl":
            return 0
        return max(1, len(self.devices))

    @property
    def identity(self) -> tuple[str, int, float]:
        return self.node, self.pid, self.start_time

    def describe(self) -> str:
        held = (
            f", holding {self.domains} protection domain(s)"
            f"{' on ' + ', '.join(self.devices) if self.devices else ''}"
            if self.domains
            else ""
        )
        port = ", listening on the model's port" if self.holds_port else ""
        command = " ".join(self.cmdline)[:160]
        return (
            f"{self.node}: pid {self.pid} ({self.role}, state {self.state}{held}{port})"
            f" survives SIGKILL: {command}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "cmdline": list(self.cmdline),
            "role": self.role,
            "state": self.state,
            "model": self.model,
            "backend": self.backend,
            "devices": list(self.devices),
            "domains": self.domains,
            "holds_port": self.holds_port,
        }

    @classmethod
    def from_json(cls, node: str, model: str, entry: Mapping[str, Any]) -> Survivor:
        """A sweep document's `unkillable` entry (fields it lacks take their defaults)."""
        return cls(
            node=node,
            pid=int(entry.get("pid", -1)),
            start_time=float(entry.get("start_time", 0.0)),
            cmdline=tuple(str(word) for word in entry.get("cmdline", ())),
            role=str(entry.get("role", "?")),
            state=str(entry.get("state", "?")),
            model=str(entry.get("model") or model),
            backend=str(entry.get("backend", "unknown")),
            devices=tuple(str(d) for d in entry.get("devices", ())),
            holds_port=bool(entry.get("holds_port", False)),
        )


def reboot_advice(
    node: str, survivors: Sequence[Survivor], models_on_node: Sequence[str] = ()
) -> str:
    """`reboot ai002 to free 2 protection domain(s) (models placed there: glm, qwq)`."""
    domains = sum(s.domains for s in survivors if s.node == node)
    freed = (
        f" to free {domains} protection domain(s)"
        if domains
        else " to end what survives SIGKILL there"
    )
    placed = f" (models placed there: {', '.join(models_on_node)})" if models_on_node else ""
    return f"reboot {node}{freed}{placed}"


@dataclass
class SurvivorVerdict:
    """Every node's survivors after a sweep, and which of them stop a start."""

    model: str
    survivors: list[Survivor] = field(default_factory=list)

    @property
    def blocking(self) -> list[Survivor]:
        """Those that hold what no start can do without: the model's port."""
        return [s for s in self.survivors if s.holds_port]

    @property
    def blocked(self) -> bool:
        return bool(self.blocking)

    @property
    def nodes(self) -> list[str]:
        return sorted({s.node for s in self.survivors})

    @property
    def reboot_nodes(self) -> list[str]:
        """The nodes whose reboot a blocked start needs."""
        return sorted({s.node for s in self.blocking})

    def advice(self, inventory: Inventory | None = None) -> list[str]:
        """One `reboot NODE ...` per node with survivors, naming every model placed there."""
        return [
            reboot_advice(node, self.survivors, _models_on(inventory, node)) for node in self.nodes
        ]

    def describe(self, inventory: Inventory | None = None) -> str:
        """Every survivor, then what frees them; "" when there is none."""
        if not self.survivors:
            return ""
        return (
            "; ".join(s.describe() for s in self.survivors)
            + ". "
            + "; ".join(self.advice(inventory))
        )

    def refusal(self, inventory: Inventory | None = None) -> str:
        """Why a blocked start stops, with the one action in it."""
        blocking = self.blocking
        nodes = ", ".join(self.reboot_nodes)
        return (
            f"a process that survives SIGKILL holds model {self.model}'s port, so no start"
            f" can listen there: {'; '.join(s.describe() for s in blocking)}. Reboot"
            f" {nodes}: only a reboot ends it ("
            + "; ".join(
                reboot_advice(n, self.survivors, _models_on(inventory, n))
                for n in self.reboot_nodes
            )
            + ")"
        )


def _models_on(inventory: Inventory | None, node: str) -> list[str]:
    if inventory is None:
        return []
    return [m.name for m in inventory.models_on(node)]


def survivors_of(model: str, documents: Mapping[str, Mapping[str, Any]]) -> SurvivorVerdict:
    """The verdict from each node's sweep document (node -> document): the helper's
    own (a caller reads a `SweepReply`: `node.sweep_reply.survivor_verdict`)."""
    verdict = SurvivorVerdict(model)
    for node, document in documents.items():
        entries: Iterable[Any] = document.get("unkillable") or ()
        verdict.survivors += [
            Survivor.from_json(node, model, e) for e in entries if isinstance(e, Mapping)
        ]
    return verdict
