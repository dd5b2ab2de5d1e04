"""Node helpers that answer from a script: what each node's helper replies (its document
and exit status), or that the node cannot be asked. Every call is recorded in order, so a
test can say what ran where, with which arguments, and in which order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.cli import helper_document
from mlx_medic.node.client import HelperCallError, HelperReply, NodeHelpers, helper_argv
from mlx_medic.transport import LocalTransport


@dataclass
class Answer:
    document: dict[str, Any] = field(default_factory=dict)
    exit_status: int = 0
    stderr: str = ""


Unreachable = HelperCallError  # an answer that is this: the node could not be asked

# What each helper answers when the test does not say: success with nothing found.
DEFAULTS: dict[str, dict[str, Any]] = {
    "facts": {
        "os": {"system": "Darwin", "build": "24G84"},
        "versions": {"mlx": "0.29.1", "mlx-lm": "0.28.0"},
        "memory": {"available_bytes": 64 * 2**30},
        "rdma": {
            "ports": [{"device": "rdma_en2", "port": 1, "state": "PORT_ACTIVE", "active": True}],
            "objects": None,
        },
        "log_errors": [],
    },
    "service": {"exit_status": 0, "stdout": "", "stderr": ""},
    "sweep": {
        "signalled": [],
        "exited": [],
        "survivors": [],
        "unkillable": [],
        "spared": [],
        "pd_spent": 0,
        "complete": True,
        "settled": True,
        "listeners_signalled": [],
    },
    "clean": {"removed": [], "bytes_freed": 0, "skipped": []},
    "room": {"memory": {"available_bytes": 64 * 2**30}, "weights": None, "staging": None},
    "backend": {"choice": "ring"},
    "orphans": {"orphans": [], "suspects": []},
    "probe": {"up": True, "conclusive": True, "reason": "completed", "latency_seconds": 0.1},
}


class FakeHelpers(NodeHelpers):
    """`answers[(node, helper)]`: an Answer, a HelperCallError, or a list of them (one per
    call, the last repeated); by default the helper succeeds (DEFAULTS)."""

    def __init__(
        self,
        inventory: Inventory,
        answers: dict[tuple[str, str], Any] | None = None,
        on_call: Callable[[str, str, tuple[str, ...]], None] | None = None,
    ):
        super().__init__(LocalTransport(), inventory, timeout=5.0)
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        self.on_call = on_call
        self.gates: dict[str, asyncio.Event] = {}  # helper -> held until set

    def of(self, helper: str) -> list[tuple[str, tuple[str, ...]]]:
        return [(node, args) for node, name, args in self.calls if name == helper]

    async def raw_call(
        self, node_name: str, helper: str, args: Sequence[str], timeout: float | None
    ) -> HelperReply[None]:
        """The scripted answer; NodeHelpers.call reads it as the caller's reply type."""
        args = tuple(args)
        self.calls.append((node_name, helper, args))
        if self.on_call is not None:
            self.on_call(node_name, helper, args)
        await asyncio.sleep(0)
        if helper in self.gates:
            await self.gates[helper].wait()
        answer = self.answers.get((node_name, helper), Answer(dict(DEFAULTS.get(helper, {}))))
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if isinstance(answer, HelperCallError):
            raise answer
        document = helper_document(helper, answer.document)
        argv = helper_argv(self.inventory.node(node_name), helper, args)
        return HelperReply(
            node_name, helper, argv, answer.exit_status, document, None, answer.stderr
        )


def unreachable(node: str, helper: str) -> HelperCallError:
    return HelperCallError(
        node, helper, "connect to 127.0.0.3 port 22: timed out", unreachable=True
    )


def stuck(
    pid: int = 4242,
    *,
    holds_port: bool = False,
    backend: str = "jaccl",
    devices: tuple[str, ...] = ("rdma_en2",),
    role: str = "rank",
    start_time: float = 1.0,
) -> dict[str, Any]:
    """A process a sweep could not end, as `node sweep` reports it in `unkillable`: in
    uninterruptible sleep, with the protection domains it is believed to hold."""
    return {
        "pid": pid,
        "start_time": start_time,
        "cmdline": ["python", "-m", "mlx_lm.server"],
        "role": role,
        "state": "uninterruptible",
        "backend": backend,
        "devices": list(devices),
        "domains": max(1, len(devices)) if backend == "jaccl" else 0,
        "holds_port": holds_port,
    }


def swept(
    *unkillable: dict[str, Any], killable: tuple[dict[str, Any], ...] = (), stderr: str = ""
) -> Answer:
    """A sweep's answer with survivors, as the helper gives it: `settled` (exit 0) when every
    survivor is unkillable and none holds the model's port, else exit 1."""
    survivors = [
        {k: e[k] for k in ("pid", "start_time", "cmdline", "role", "state")}
        for e in (*unkillable, *killable)
    ]
    settled = not killable and not any(e.get("holds_port") for e in unkillable)
    return Answer(
        {
            **DEFAULTS["sweep"],
            "survivors": survivors,
            "unkillable": list(unkillable),
            "complete": not survivors,
            "settled": settled,
        },
        exit_status=0 if settled else 1,
        stderr=stderr,
    )
