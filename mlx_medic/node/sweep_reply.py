"""What `mlx-medic node sweep MODEL` tells a caller (`SweepReply`): the remediator's sweep
step and the serve wrapper read the same fields, and judge survivors by one verdict
(`survivor_verdict`, mlx_medic.processes.survivors). Fields missing or ill-typed read as unknown
(mlx_medic.node.replies); a process without a pid is garbage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from mlx_medic.node.replies import Fields, ProcessEntry, Reply, ReplyError
from mlx_medic.processes.survivors import Survivor, SurvivorVerdict

NO_LEDGER = {"error": "the sweep sent no ledger"}


def _survivor(node: str, model: str, entry: Fields) -> Survivor:
    """An `unkillable` entry: a process (its pid required) with what it holds."""
    entry.pid(), entry.start_time()
    try:
        return Survivor.from_json(node, model, entry.data)
    except (TypeError, ValueError) as exc:
        raise ReplyError(entry.at, f"is not a survivor: {exc}") from None


@dataclass(frozen=True)
class SweepReply(Reply):
    helper: ClassVar[str] = "sweep"
    signalled: tuple[ProcessEntry, ...] = ()
    spared: tuple[ProcessEntry, ...] = ()
    survivors: tuple[ProcessEntry, ...] = ()  # what outlived the sweep, unkillable or not
    unkillable: tuple[Survivor, ...] = ()  # in uninterruptible sleep: a reboot ends them
    not_ours: tuple[ProcessEntry, ...] = ()  # another user's: may not signal, left alone
    pd_spent: int = 0
    settled: bool = False  # `settled` (an older helper: `complete`); unknown: not settled
    serving_listener: ProcessEntry | None = None  # the start sweep's answering listener
    # the node's ledger as the sweep left it (`boot_id`, `debt_by_unit`), or `error`: what
    # the serve wrapper judges a start by (mlx_medic.serve.backend)
    ledger: dict[str, Any] = field(default_factory=lambda: dict(NO_LEDGER))

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        model = document.text("model") or ""
        settled = document.flag("settled")
        listener = document.obj("serving_listener")
        return cls(
            ProcessEntry.read_all(document, "signalled"),
            ProcessEntry.read_all(document, "spared"),
            ProcessEntry.read_all(document, "survivors"),
            tuple(_survivor(node, model, e) for e in document.objects("unkillable")),
            ProcessEntry.read_all(document, "not_ours"),
            document.number("pd_spent") or 0,
            bool(document.flag("complete")) if settled is None else settled,
            ProcessEntry.read(listener) if listener else None,
            dict(document.obj("ledger").data) or dict(NO_LEDGER),
        )

    @property
    def killable(self) -> tuple[ProcessEntry, ...]:
        """What survived without being unkillable: a sweep could have ended it (or may not:
        `policy.sigkill` false)."""
        stuck = {(s.pid, s.start_time) for s in self.unkillable}
        return tuple(s for s in self.survivors if s.identity not in stuck)


def survivor_verdict(model: str, replies: Iterable[SweepReply]) -> SurvivorVerdict:
    """Every node's unkillable survivors, in one verdict (nodes in the order asked)."""
    return SurvivorVerdict(model, [s for reply in replies for s in reply.unkillable])
