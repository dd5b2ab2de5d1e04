"""Is a model serving, asked from where its server can be reached.

A model listening on loopback answers only on its head node: probed from the
remediator's machine, 127.0.0.1 is the wrong machine, and "connection refused" there
would act on a healthy model. So such a model is probed on its head with the node helper
`mlx-medic node probe MODEL` (over SSH, like every helper), unless the remediator runs
on that head. Which node
the remediator runs on is said (config `node`, or `<state_dir>/node-id`), never guessed
from addresses: on the testbed every node is 127.0.0.N on one machine, so a loopback
SSH address does not mean "this machine".

A verdict has three values, and "could not tell" is never "down": nothing acts on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from mlx_medic import health
from mlx_medic.inventory.fields import is_loopback
from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import REMEDIATOR, HelperCallError, HelperMisconfigured, NodeHelpers
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.remediator.config import ConfigError
from mlx_medic.state.node_identity import NodeIdentityError, node_id_path, read_node_id
from mlx_medic.transport import NodeTransport

log = logging.getLogger("mlx_medic.remediator.model_health")

PROBE_TIMEOUT = 10.0
# `mlx-medic node probe` on the head: may wait a probe's length for the node's probe
# lock, then probe; plus its own start-up.
REMOTE_PROBE_TIMEOUT = 2 * PROBE_TIMEOUT + 15.0
ProbeFrom = Literal["auto", "remediator", "head"]


class ModelState(StrEnum):
    UP = "up"
    DOWN = "down"
    UNKNOWN = "unknown"  # could not tell: the probe did not run or gave no clear answer


@dataclass(frozen=True)
class HealthVerdict:
    state: ModelState
    reason: str
    unreachable_node: str | None = None  # unknown because this node did not answer over SSH
    # unknown because a node's mlx-medic cannot serve the probe as deployed
    misconfiguration: Misconfiguration | None = None
    # What was probed and from where (`probe_model_health`): on-call reads why a run acted
    probed: str = ""

    def probed_as(self, probed: str) -> HealthVerdict:
        """This verdict, saying what was probed and from where."""
        return replace(self, probed=probed)

    @classmethod
    def up(cls, reason: str) -> HealthVerdict:
        return cls(ModelState.UP, reason)

    @classmethod
    def down(cls, reason: str) -> HealthVerdict:
        return cls(ModelState.DOWN, reason)

    @classmethod
    def unknown(cls, reason: str) -> HealthVerdict:
        return cls(ModelState.UNKNOWN, reason)

    @classmethod
    def unreachable(cls, node: str, reason: str) -> HealthVerdict:
        return cls(ModelState.UNKNOWN, reason, unreachable_node=node)

    @classmethod
    def misconfigured(cls, found: Misconfiguration, reason: str) -> HealthVerdict:
        return cls(ModelState.UNKNOWN, reason, misconfiguration=found)

    @classmethod
    def of(cls, up: bool, conclusive: bool, reason: str) -> HealthVerdict:
        """From a probe's (up, conclusive) pair: inconclusive is unknown, whatever `up` says."""
        if not conclusive:
            return cls.unknown(reason)
        return cls.up(reason) if up else cls.down(reason)


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address that means "the machine you are on"."""
    return is_loopback(host.strip().lower().rstrip("."))


def remediator_node(configured: str | None, inventory: Inventory) -> str | None:
    """The inventory node this remediator runs on: `configured` (config `node`), else
    `<state_dir>/node-id`; None when neither names one (it runs off the cluster).
    A name the inventory does not list is a ConfigError that says where it came from."""
    try:
        name = configured or read_node_id(inventory.state_dir)
    except NodeIdentityError as exc:
        raise ConfigError(str(exc)) from exc
    if name is None:
        return None
    known = [node.name for node in inventory.nodes]
    if name not in known:
        source = "node" if configured else str(node_id_path(inventory.state_dir))
        raise ConfigError(
            f"{source}: {name!r} is not a node of the inventory (nodes: {', '.join(known)})"
        )
    return name


def probes_on_head(model: Model, probe_from: ProbeFrom, this_node: str | None) -> bool:
    """Must the model be probed on its head (over SSH) rather than from here?"""
    if probe_from != "auto":
        return probe_from == "head"
    if not is_loopback_host(model.host):
        return False  # a wildcard or a real address is reachable from here
    return this_node != model.head


async def probe_model_health(
    model: Model,
    inventory: Inventory,
    *,
    transport: NodeTransport,
    probe_from: ProbeFrom = "auto",
    this_node: str | None = None,
) -> HealthVerdict:
    """`mlx_medic.health.probe_model_async` on the model's server, from where that server
    can be reached (see `probes_on_head`); a wildcard listen address means the head
    node's own address."""
    head = inventory.node(model.head)
    if probes_on_head(model, probe_from, this_node):
        verdict = await _probe_on_head(model, inventory, transport)
        return verdict.probed_as(
            f"`mlx-medic node probe {model.name}` on the head {model.head}, over SSH"
        )
    # Probed from here, a server listening on every address is reached at its head's
    # address; probed on the head itself, it answers on loopback (health.probe_host).
    host = head.ssh if model.host in health.WILDCARD_HOSTS else model.host
    result = await health.probe_model_async(host, model.port, timeout=PROBE_TIMEOUT)
    here = f"this remediator's host ({this_node})" if this_node else "this remediator's host"
    verdict = HealthVerdict.of(result.up, result.conclusive, result.reason)
    return verdict.probed_as(f"{host}:{model.port} from {here}")


async def _probe_on_head(
    model: Model, inventory: Inventory, transport: NodeTransport
) -> HealthVerdict:
    """`mlx-medic node probe MODEL` on the head; anything but a clean up/down answer is
    unknown (nothing acts on it)."""
    where = f"on {model.head}"
    helpers = NodeHelpers(transport, inventory, timeout=REMOTE_PROBE_TIMEOUT, caller=REMEDIATOR)
    timeout = f"{PROBE_TIMEOUT:g}"
    try:
        reply = await helpers.call(model.head, "probe", model.name, "--timeout", timeout)
        answer = health.ProbeAnswer.from_document(reply.document)
    except HelperMisconfigured as exc:
        return HealthVerdict.misconfigured(exc.misconfiguration, f"could not probe {where}: {exc}")
    except HelperCallError as exc:  # not knowing is never "down"
        if exc.unreachable:  # in the transport's own words
            return HealthVerdict.unreachable(
                model.head, f"could not probe {where}: {exc.__cause__}"
            )
        return HealthVerdict.unknown(f"could not probe {where}: {exc}")
    except Exception as exc:  # a document without a verdict (ValueError), or worse
        return HealthVerdict.unknown(f"`mlx-medic node probe` {where} gave no verdict: {exc}")
    return HealthVerdict.of(answer.up, answer.conclusive, f"{where}: {answer.reason}")
