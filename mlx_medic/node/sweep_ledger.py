"""What a sweep writes into its node's protection-domain ledger (mlx_medic.state.ledger):
spends, the JACCL ranks a signal of ours is about to end, and the survivors already
recorded this boot. A test gives a spender of its own instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Spender = Callable[..., bool]
Ended = tuple[int, float, "str | None", tuple[str, ...]]  # pid, start time, model, devices


class LedgerNotes:
    """What a sweep writes into its node's ledger: a spend (a SIGKILLed JACCL rank, a
    survivor), and before SIGTERM the JACCL ranks a signal of ours is about to end."""

    def __init__(self, state_dir: Path, node: str):
        self.state_dir, self.node = state_dir, node

    def spend(self, **fields: Any) -> bool:
        from mlx_medic.state.ledger import record_spend

        kind = fields.pop("kind", "sigkill")
        return record_spend(self.state_dir, self.node, kind, **fields)

    def ended(self, processes: Sequence[Ended]) -> None:
        from mlx_medic.state.ledger import record_ended

        record_ended(self.state_dir, self.node, processes)

    def count_gone(self) -> None:
        """JACCL ranks registered by their guards that are gone by no signal of ours:
        counted before this sweep reports (mlx_medic.node.rank_register)."""
        from mlx_medic.node.rank_register import count_gone

        count_gone(self.state_dir, self.node)

    def survivors(self) -> set[tuple[int, float]]:
        """(pid, start time) of every survivor the ledger records this boot."""
        from mlx_medic.state.ledger import LedgerError, read_ledger

        try:
            ledger = read_ledger(self.state_dir, self.node)
        except LedgerError:
            return set()
        return {(e.pid, e.start_time) for e in ledger.survivors}


class _CallableNotes(LedgerNotes):
    """A test's spender (keyword arguments, `kind` among them); nothing else is noted."""

    def __init__(self, spender: Spender):
        self._spender = spender

    def spend(self, **fields: Any) -> bool:
        return self._spender(**fields)

    def ended(self, processes: Sequence[Ended]) -> None:
        return None

    def count_gone(self) -> None:
        return None

    def survivors(self) -> set[tuple[int, float]]:
        return set()
