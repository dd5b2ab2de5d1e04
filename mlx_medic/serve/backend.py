"""Choosing the backend: the model's durable choice on the head, then each node's
protection-domain ledger, then a smoke test. JACCL first (tensor parallel), else ring
with the ring hostfile and `--pipeline`.

The smoke test is itself a JACCL init/teardown cycle, so it is skipped when the last
JACCL start of the model came up since every node's current boot and no JACCL error (a
failed JACCL start, or a JACCL error line in a run's output) has been seen since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlx_medic.backend_choice import BackendChoice
from mlx_medic.inventory import Backend, Model
from mlx_medic.node.client import HelperCallError, HelperReply
from mlx_medic.serve.record import Failure, ServeRecord

log = logging.getLogger("mlx_medic.serve")


@dataclass(frozen=True)
class Candidate:
    name: str  # jaccl | ring
    backend: Backend


def candidates(model: Model, choice: BackendChoice) -> tuple[list[Candidate], list[Failure]]:
    """The backends to try in order, and why the others are out (as failures to report)."""
    configured = dict(model.backends.in_order())
    wanted = ["jaccl", "ring"] if choice.choice == "auto" else [choice.choice]
    found, refused = [], []
    for name in wanted:
        if name in configured:
            found.append(Candidate(name, configured[name]))
        else:
            refused.append(Failure(name, model.head, f"pinned to {name} by"
                                   f" {choice.by or 'someone'} ({choice.reason}) but the"
                                   f" model has no {name} backend")
                           if choice.pinned else
                           Failure(name, model.head, f"the model has no {name} backend"))
    return found, refused


Replies = dict[str, HelperReply | HelperCallError]


def ledger_refusal(model: Model, ledgers: Replies) -> Failure | None:
    """A reason not to start JACCL: a node at its reserve, or a ledger that cannot be read
    (an unknown debt is not room for another spend)."""
    for node in model.nodes:
        reply = ledgers.get(node)
        if isinstance(reply, HelperCallError) or reply is None or not reply.ok:
            return Failure("jaccl", node, f"its ledger cannot be read ({reply})")
        reserve = reply.document.get("reserves", {}).get(model.name, {})
        if not reserve.get("jaccl_allowed", False):
            debt = reply.document.get("debt")
            return Failure("jaccl", node, f"the protection-domain ledger is at the reserve"
                           f" ({debt} spent this boot, reserve {reserve.get('reserve')}):"
                           " no JACCL start there until it reboots")  # fmt: skip
    return None


def boot_ids(ledgers: Replies) -> dict[str, str]:
    return {node: str(reply.document.get("boot_id")) for node, reply in ledgers.items()
            if isinstance(reply, HelperReply) and reply.document.get("boot_id")}  # fmt: skip


def smoke_can_be_skipped(
    record: ServeRecord | None, boots: dict[str, str], nodes: list[str]
) -> bool:
    """The last JACCL start came up in every node's current boot, and no JACCL error (or
    failed JACCL start) has been seen since."""
    if record is None or record.last_jaccl_success is None:
        return False
    success = record.last_jaccl_success
    if any(boots.get(n) is None or success.boot_ids.get(n) != boots[n] for n in nodes):
        return False
    return record.jaccl_error_at is None or record.jaccl_error_at < success.at
