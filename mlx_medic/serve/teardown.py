"""Ending every rank of this run on every node, within the policy's stop timeout.

Found by run id, not by pid files (mlx.launch's go missing): `node sweep MODEL --run R`
on every node at once (SIGTERM, grace, SIGKILL where the policy allows, each process's
identity checked before each signal), mlx.launch on the head ended beside it, then the
run cleared as current, so any guard still watching ends what is left."""

from __future__ import annotations

import asyncio
import logging
import time

from mlx_medic.inventory.model import Model
from mlx_medic.serve.nodes import ModelNodes
from mlx_medic.serve.supervise import Launch, remaining

log = logging.getLogger("mlx_medic.serve")
EXIT_MARGIN = 2.0  # seconds kept back from stop_timeout for the last record and exit


def teardown_deadline(model: Model) -> float:
    return time.monotonic() + max(1.0, model.policy.stop_timeout - EXIT_MARGIN)


async def end_run(
    nodes: ModelNodes, run_id: str, launch: Launch | None, deadline: float
) -> list[str]:
    """What could not be ended (one sentence per node); empty when all went. Ranks whose
    mlx.launch is gone get the short grace of a dead launch (docs/decisions.md)."""
    budget = remaining(deadline)
    sweep_limit = max(1.0, budget * 0.75)
    launcher_dead = launch is None or not launch.running
    policy = nodes.model.policy
    grace = min(policy.dead_launch_grace if launcher_dead else policy.kill_grace, budget / 3)
    ending = [nodes.sweep_run(run_id, timeout=sweep_limit, launcher_dead=launcher_dead)]
    if launch is not None:
        ending.append(launch.end(grace))  # type: ignore[arg-type]
    results = await asyncio.gather(*ending)
    sweep = results[0]
    problems = list(sweep.problems)
    cleared = await nodes.clear_run(run_id, timeout=max(1.0, remaining(deadline)))
    problems += cleared
    for problem in problems:
        log.error("teardown: %s", problem)
    return problems
