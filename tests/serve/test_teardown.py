"""The teardown keeps its bound: with nodes that never answer, the wrapper still gets
through its teardown within the model's policy.stop_timeout (the rendered service files
wait longer before their own SIGKILL), and names every node it could not reach."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Node
from mlx_medic.node.client import NodeHelpers
from mlx_medic.serve.nodes import ModelNodes
from mlx_medic.serve.teardown import end_run, teardown_deadline
from mlx_medic.transport import CommandResult

INVENTORY = parse_inventory("""\
nodes:
  ai001: {ssh: 127.0.0.2}
  ai002: {ssh: 127.0.0.3}
models:
  tiny:
    model: /models/tiny
    nodes: [ai001, ai002]
    port: 8123
    service: {manager: supervisord, label: tiny}
    backends: {ring: {hostfile: /etc/ring.json}}
    policy: {stop_timeout: 6s, kill_grace: 10s}
""")


class SilentTransport:
    """Every command hangs until its caller's time limit, like a node gone quiet."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], float]] = []

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        self.calls.append((node.name, argv, timeout))
        await asyncio.sleep(timeout)
        return CommandResult(None, "", "", timed_out=True)


def test_the_teardown_ends_within_the_stop_timeout_when_no_node_answers(tmp_path: Path):
    model = INVENTORY.model("tiny")
    transport = SilentTransport()
    nodes = ModelNodes(NodeHelpers(transport, INVENTORY, 60.0), model, 60.0)  # type: ignore[arg-type]

    async def bounded() -> list[str]:
        return await asyncio.wait_for(
            end_run(nodes, "run-1", None, teardown_deadline(model)),
            timeout=model.policy.stop_timeout,
        )

    problems = asyncio.run(bounded())
    assert [p.split(":")[0] for p in problems] == ["ai001", "ai002", "ai001", "ai002"]
    assert "no answer" in problems[0]
    helpers = [(node, argv[2:4], argv[4:6]) for node, argv, _ in transport.calls]
    assert helpers[:2] == [
        ("ai001", ["sweep", "tiny"], ["--run", "run-1"]),
        ("ai002", ["sweep", "tiny"], ["--run", "run-1"]),
    ]
    assert [argv[2:6] for _, argv, _ in transport.calls[2:]] == [
        ["run", "tiny", "clear", "run-1"]
    ] * 2
