"""What the wrapper asks of every node of its model, through the node helpers: sweep,
clean, record the run and its lease, renew it, clear it. Nodes in parallel, each call
with a time limit; an answer that did not come is said, with the node's name."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from mlx_medic.inventory.model import Model
from mlx_medic.node.client import HelperCallError, HelperReply, NodeHelpers, R
from mlx_medic.node.replies import CleanReply, ProcessEntry, RunReply
from mlx_medic.node.sweep_reply import SweepReply, survivor_verdict
from mlx_medic.processes.survivors import SurvivorVerdict

log = logging.getLogger("mlx_medic.serve")


class StartRefused(Exception):
    """The wrapper must not start (or cannot go on); the message says why, naming nodes."""


@dataclass
class SweepOutcome:
    """Every node's sweep, judged: `complete` when every node answered and its sweep is
    settled (nothing survived, or only what no sweep can end and no start needs)."""

    complete: bool
    problems: list[str] = field(default_factory=list)  # one sentence per node that failed
    replies: dict[str, SweepReply] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)  # each node's stderr (its warnings)
    survivors: SurvivorVerdict | None = None
    serving: dict[str, ProcessEntry] = field(default_factory=dict)  # node -> listener

    @property
    def ledgers(self) -> dict[str, dict[str, Any]]:
        """Each node's ledger as its sweep left it (`boot_id`, `debt_by_unit`), or
        `error`: what a start is judged by."""
        return {node: dict(sweep.ledger) for node, sweep in self.replies.items()}

    @property
    def blocked(self) -> bool:
        return self.survivors is not None and self.survivors.blocked


def judge_sweep(
    model: str, replies: dict[str, HelperReply[SweepReply] | HelperCallError]
) -> SweepOutcome:
    """Complete when every node answered and its sweep settled; the survivors (if any)
    named in one verdict, the start going on around them unless one blocks it."""
    outcome = SweepOutcome(True)
    for node, reply in replies.items():
        if isinstance(reply, HelperCallError):
            outcome.complete = False
            why = "unreachable" if reply.unreachable else "no answer"
            outcome.problems.append(f"{node}: {why}: {reply}")
            continue
        sweep = reply.answer
        outcome.replies[node] = sweep
        if reply.stderr.strip():
            outcome.said[node] = reply.stderr.strip()
        if sweep.serving_listener is not None:
            outcome.serving[node] = sweep.serving_listener
        if not reply.ok or not sweep.settled:
            outcome.complete = False
            if sweep.killable:
                outcome.problems.append(
                    f"{node}: {len(sweep.killable)} process(es) survived the"
                    " sweep and are not in uninterruptible sleep"
                )
            elif not sweep.unkillable:
                outcome.problems.append(
                    f"{node}: the sweep did not complete: {reply.stderr.strip()[-300:] or 'exit 1'}"
                )
    outcome.survivors = survivor_verdict(model, outcome.replies.values())
    return outcome


class ModelNodes:
    """The model's nodes, asked through the helpers."""

    def __init__(self, helpers: NodeHelpers, model: Model, timeout: float):
        self.helpers = helpers
        self.model = model
        self.timeout = timeout  # one call's limit

    @property
    def names(self) -> list[str]:
        return list(self.model.nodes)

    async def on_all(
        self, helper: type[R], *args: str, timeout: float | None = None
    ) -> dict[str, HelperReply[R] | HelperCallError]:
        limit = self.timeout if timeout is None else timeout
        return await self.helpers.on_nodes(self.names, helper, *args, timeout=limit)

    @property
    def dead_launch_grace(self) -> str:
        policy = self.model.policy
        return f"{min(policy.dead_launch_grace, policy.kill_grace):g}"

    async def start_sweep(self, crashed_run: str | None = None) -> SweepOutcome:
        """Every process of the model on every node, a hung listener on its port too: no
        run of it may exist before this start (the lock is held), so whatever is found is
        a dead launch's, ended with the short grace (an answering listener is spared,
        but for one of `crashed_run`: the wrapper's own run that just crashed)."""
        crashed = ["--crashed-run", crashed_run] if crashed_run else []
        return judge_sweep(
            self.model.name,
            await self.on_all(
                SweepReply,
                self.model.name,
                "--start-sweep",
                "--grace",
                self.dead_launch_grace,
                *crashed,
            ),
        )

    async def sweep_run(
        self, run_id: str, timeout: float, launcher_dead: bool = False
    ) -> SweepOutcome:
        grace = ["--grace", self.dead_launch_grace] if launcher_dead else []
        return judge_sweep(
            self.model.name,
            await self.on_all(
                SweepReply, self.model.name, "--run", run_id, *grace, timeout=timeout
            ),
        )

    async def clean(self) -> list[str]:
        """Problems, one per node whose clean failed (a clean that fails stops nothing:
        stale files waste space, they start no rank)."""
        replies = await self.on_all(CleanReply, self.model.name)
        return [
            _failed(node, reply)
            for node, reply in replies.items()
            if isinstance(reply, HelperCallError) or not reply.ok
        ]

    async def record_run(self, run_id: str, lease: float, holder: str) -> list[str]:
        replies = await self.on_all(
            RunReply, self.model.name, "set", run_id, "--lease", f"{lease:g}", "--holder", holder
        )
        return [
            _failed(node, reply)
            for node, reply in replies.items()
            if isinstance(reply, HelperCallError) or not reply.ok
        ]

    async def renew_run(self, run_id: str, lease: float, holder: str) -> list[str]:
        replies = await self.on_all(
            RunReply,
            self.model.name,
            "renew",
            run_id,
            "--lease",
            f"{lease:g}",
            "--holder",
            holder,
            timeout=lease / 2,
        )
        return [
            _failed(node, reply)
            for node, reply in replies.items()
            if isinstance(reply, HelperCallError) or not reply.ok
        ]

    async def clear_run(self, run_id: str, timeout: float) -> list[str]:
        replies = await self.on_all(RunReply, self.model.name, "clear", run_id, timeout=timeout)
        return [
            _failed(node, reply)
            for node, reply in replies.items()
            if isinstance(reply, HelperCallError) or not reply.ok
        ]


def _failed(node: str, reply: HelperReply[Any] | HelperCallError) -> str:
    if isinstance(reply, HelperCallError):
        return str(reply)
    return f"{node}: mlx-medic node {reply.helper}: exit {reply.exit_status}: " + (
        reply.stderr.strip()[-300:] or str(reply.document)[:300]
    )


class LeaseKeeper:
    """Renews the run's lease on every node, a round every quarter of its length (each call
    may take half of it: a helper starts slowly on a busy node), until stopped. A node
    renewed at least every three quarters of the lease never sees it run out."""

    def __init__(self, nodes: ModelNodes, run_id: str, lease: float, holder: str):
        self.nodes, self.run_id, self.lease, self.holder = nodes, run_id, lease, holder
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            for problem in await self.nodes.renew_run(self.run_id, self.lease, self.holder):
                log.warning("lease renewal failed: %s", problem)
            await asyncio.sleep(max(0.0, self.lease / 4 - (time.monotonic() - started)))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
