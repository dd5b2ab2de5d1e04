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

from mlx_medic.inventory import Model
from mlx_medic.node.client import HelperCallError, HelperReply, NodeHelpers

log = logging.getLogger("mlx_medic.serve")


class StartRefused(Exception):
    """The wrapper must not start (or cannot go on); the message says why, naming nodes."""


@dataclass
class SweepOutcome:
    complete: bool
    problems: list[str] = field(default_factory=list)  # one sentence per node that failed
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)  # each node's stderr (its warnings)


def _describe_unkillable(node: str, document: dict[str, Any]) -> list[str]:
    found = []
    for proc in document.get("unkillable", []):
        cmd = " ".join(proc.get("cmdline", []))[:160]
        found.append(f"{node}: pid {proc.get('pid')} ({proc.get('role', '?')}, state"
                     f" {proc.get('state', '?')}) is unkillable: {cmd}; reboot {node}")  # fmt: skip
    return found


def judge_sweep(replies: dict[str, HelperReply | HelperCallError]) -> SweepOutcome:
    """Complete only when every node answered and nothing survived."""
    outcome = SweepOutcome(True)
    for node, reply in replies.items():
        if isinstance(reply, HelperCallError):
            outcome.complete = False
            why = "unreachable" if reply.unreachable else "no answer"
            outcome.problems.append(f"{node}: {why}: {reply}")
            continue
        outcome.replies[node] = reply.document
        if reply.stderr.strip():
            outcome.said[node] = reply.stderr.strip()
        if not reply.ok or not reply.document.get("complete", False):
            outcome.complete = False
            named = _describe_unkillable(node, reply.document)
            survivors = reply.document.get("survivors", [])
            if not named and survivors:
                named = [f"{node}: {len(survivors)} process(es) survived the sweep"]
            outcome.problems += named or [
                f"{node}: the sweep did not complete: {reply.stderr.strip()[-300:] or 'exit 1'}"]
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
        self, helper: str, *args: str, timeout: float | None = None
    ) -> dict[str, HelperReply | HelperCallError]:
        limit = self.timeout if timeout is None else timeout
        return await self.helpers.on_nodes(self.names, helper, *args, timeout=limit)

    async def start_sweep(self) -> SweepOutcome:
        """Every process of the model on every node, the listener on its port too: no run
        of it may exist before this start (the lock is held)."""
        return judge_sweep(await self.on_all("sweep", self.model.name, "--start-sweep"))

    async def sweep_run(self, run_id: str, timeout: float) -> SweepOutcome:
        return judge_sweep(await self.on_all("sweep", self.model.name, "--run", run_id,
                                             timeout=timeout))  # fmt: skip

    async def clean(self) -> list[str]:
        """Problems, one per node whose clean failed (a clean that fails stops nothing:
        stale files waste space, they start no rank)."""
        replies = await self.on_all("clean", self.model.name)
        return [_failed(node, reply) for node, reply in replies.items()
                if isinstance(reply, HelperCallError) or not reply.ok]  # fmt: skip

    async def record_run(self, run_id: str, lease: float, holder: str) -> list[str]:
        replies = await self.on_all("run", self.model.name, "set", run_id,
                                    "--lease", f"{lease:g}", "--holder", holder)  # fmt: skip
        return [_failed(node, reply) for node, reply in replies.items()
                if isinstance(reply, HelperCallError) or not reply.ok]  # fmt: skip

    async def renew_run(self, run_id: str, lease: float, holder: str) -> list[str]:
        replies = await self.on_all("run", self.model.name, "renew", run_id,
                                    "--lease", f"{lease:g}", "--holder", holder,
                                    timeout=lease / 2)  # fmt: skip
        return [_failed(node, reply) for node, reply in replies.items()
                if isinstance(reply, HelperCallError) or not reply.ok]  # fmt: skip

    async def clear_run(self, run_id: str, timeout: float) -> list[str]:
        replies = await self.on_all("run", self.model.name, "clear", run_id, timeout=timeout)
        return [_failed(node, reply) for node, reply in replies.items()
                if isinstance(reply, HelperCallError) or not reply.ok]  # fmt: skip

    async def ledgers(self) -> dict[str, HelperReply | HelperCallError]:
        return await self.on_all("ledger")


def _failed(node: str, reply: HelperReply | HelperCallError) -> str:
    if isinstance(reply, HelperCallError):
        return str(reply)
    return f"{node}: mlx-medic node {reply.helper}: exit {reply.exit_status}: " + (
        reply.stderr.strip()[-300:] or str(reply.document)[:300])


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

