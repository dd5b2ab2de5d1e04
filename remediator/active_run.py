"""A run this process has queued or is running (`ActiveRun`), and how a run ended
(`RunEnd`): the one record the decision, the runner, start-up and the engine share.

The journal holds what a run did; this holds what only the live process knows: the
firings it holds, the nodes it acts on, its phase and its task."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from dataclasses import dataclass, field
from typing import NamedTuple

from mlx_medic.remediator.outcomes import RunOutcome
from mlx_medic.remediator.playbooks import Playbook


@dataclass
class ActiveRun:
    run_id: int
    model: str
    playbook: Playbook
    dry_run: bool
    trigger: str  # 'alert' | 'manual' | 'startup'
    fingerprints: set[str] = field(default_factory=set)
    phase: str = "queued"  # queued -> starting (taking the lock) -> executing
    cancelled: bool = False
    ended: bool = False
    task: asyncio.Task[None] | None = None
    firings: set[tuple[str, str]] = field(default_factory=set)  # dedupe keys it holds
    nodes: set[str] = field(default_factory=set)  # the nodes its alerts named; empty: all
    nodes_fixed: bool = False  # its steps were given `nodes`: later ones are not acted on
    after: asyncio.Task[None] | None = None  # the run of the model it waits for, if any
    # Set when a run of the model is queued to act after this one (a model-down alert, or
    # an orphan alert for another node, during a sweep-orphans run): a step that only
    # waits (confirm-clean's window) stops waiting
    successor: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once the run has looked at what its alerts report for the last time
    # (confirm-clean's last clean check): an alert for the model after that is queued
    # after the run, not absorbed, since the run would never act on it
    settled: bool = False
    live_would: str = ""  # a dry run: what live mode would do (the decision's budget)

    def covers(self, named: Set[str]) -> bool:
        """Whether the run acts on the nodes an alert names (empty: every node), so the
        alert may join it: a playbook acting on every node, a run that has not fixed its
        nodes yet, or one whose nodes include them."""
        if not self.playbook.per_node or not self.nodes_fixed:
            return True
        return not self.nodes or (bool(named) and named <= self.nodes)

    def settle(self) -> None:
        self.settled = True

    def join(self, named: Set[str]) -> None:
        """Add an alert's nodes to a run that has not fixed them (empty stays: every node)."""
        if not self.nodes_fixed and self.nodes:
            self.nodes = self.nodes | named if named else set()


class RunEnd(NamedTuple):
    """How a run ended, as journaled: outcome, why, and the next action for on-call."""

    outcome: RunOutcome
    detail: str
    next_action: str | None = None
