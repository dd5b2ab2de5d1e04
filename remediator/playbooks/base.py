"""What a playbook is: a plan of steps, and its own answer to "is there still work?".

Why a plan first: the whole run can be shown (dry run, on-call log) before any of it
happens, and each step is journaled before it starts. The engine owns the control flow
(order, fallback after a failed verify, escalation); a playbook composes steps and
says, just before acting, whether the alert still holds: `recover` acts on a model
that is down, while a playbook that removes orphans acts on a model that is up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperCallError, HelperMisconfigured
from mlx_medic.node.misconfiguration import Misconfiguration
from mlx_medic.remediator.model_health import ModelState
from mlx_medic.remediator.steps.base import RunContext, Step


@dataclass(frozen=True)
class RecheckVerdict:
    """Act, or skip with the reason (journaled as the run's detail). A skip that could not
    tell is `undecided` (not journaled as stale news); when it could not tell because a
    node did not answer, `unreachable_node` names it and the run ends unreachable; because
    a node's mlx-medic is deployed wrong, `misconfiguration` says what and the run ends
    misconfigured. `probed`: what was asked and from where (a health probe), for on-call."""

    should_act: bool
    reason: str
    undecided: bool = False
    unreachable_node: str | None = None
    misconfiguration: Misconfiguration | None = None
    probed: str = ""

    @classmethod
    def act(cls, reason: str, *, probed: str = "") -> RecheckVerdict:
        return cls(True, reason, probed=probed)

    @classmethod
    def skip(
        cls,
        reason: str,
        *,
        undecided: bool = False,
        unreachable_node: str | None = None,
        misconfiguration: Misconfiguration | None = None,
        probed: str = "",
    ) -> RecheckVerdict:
        undecided = undecided or unreachable_node is not None or misconfiguration is not None
        return cls(False, reason, undecided, unreachable_node, misconfiguration, probed)

    @classmethod
    def not_asked(
        cls, reason: str, node: str, error: HelperCallError, *, probed: str = ""
    ) -> RecheckVerdict:
        """Could not tell: `node`'s helper gave no answer (`error`), which names the node
        when it did not answer and the misconfiguration when it is deployed wrong."""
        return cls.skip(
            reason,
            undecided=True,
            unreachable_node=node if error.unreachable else None,
            misconfiguration=(
                error.misconfiguration if isinstance(error, HelperMisconfigured) else None
            ),
            probed=probed,
        )

    def journaled(self, *, dry_run: bool = False) -> str:
        """The run's `recheck` as on-call reads it: the verdict, why, and what was probed
        from where. A dry run that could not tell plans anyway: "not checked"."""
        if self.should_act:
            verdict = "act"
        elif self.undecided:
            verdict = "not checked (a dry run plans anyway)" if dry_run else "skip, undecided"
        else:
            verdict = "skip"
        probed = f" (probed {self.probed})" if self.probed else ""
        return f"{verdict}: {self.reason}{probed}"


class Playbook(ABC):
    # Acts on a model that serves (removes orphans): an alert routed to a playbook that is
    # not `while_up` (the model is down) is queued after its run, never absorbed by it.
    while_up: ClassVar[bool] = False
    # Counts only its own runs against the model's restart budget and never opens the
    # model's circuit (its escalations page without it), so routine runs of it cannot
    # stop `recover` from acting.
    own_budget: ClassVar[bool] = False
    # Acts only on the nodes its alerts named (`plan_for` uses them): once a run has fixed
    # its nodes, an alert naming another node is queued after it, never absorbed by it.
    per_node: ClassVar[bool] = False
    # Ends with the model stopped (`drain`): every step done is its success, with no
    # verify to wait for.
    leaves_stopped: ClassVar[bool] = False
    # Runs right after a node's boot (`undrain`), whose service may have started the serve
    # wrapper: a run of it, even by hand, waits for the model lock as long as a start may
    # take (the model's start_timeout, at least the config's lock_wait).
    waits_for_start: ClassVar[bool] = False
    # Acts on the node its alert names (`node` label), for every model placed there
    # (`reboot-node`): the alert names no model; its run is the first such model's (its
    # lock, its journal entry), and its re-check judges the pauses of every model there.
    node_scoped: ClassVar[bool] = False

    def declines(self, node: str, inventory: Inventory) -> str | None:
        """A node-scoped playbook's "not for this node" before any run (nothing started,
        the alert journaled as unrouted with these words); None: a run may start."""
        return None

    @abstractmethod
    def plan(self, model: Model, inventory: Inventory) -> list[Step]:
        """Every step the run may take, in order, including fallback steps."""

    def plan_for(self, model: Model, inventory: Inventory, nodes: Sequence[str]) -> list[Step]:
        """The plan for a run whose alerts named `nodes` (their `node` label; empty: none
        did). Most playbooks act on every node of the model whatever the alert said."""
        return self.plan(model, inventory)

    @abstractmethod
    async def recheck(self, context: RunContext) -> RecheckVerdict:
        """Just before an alert's run acts: does the alert still hold? (A manual run
        skips this: a person decided.)"""


async def recheck_model_down(context: RunContext) -> RecheckVerdict:
    """Act only on a model that is still down; could not tell is not down."""
    model = context.model
    verdict = await context.health(model)
    probed = verdict.probed
    match verdict.state:
        case ModelState.DOWN:
            return RecheckVerdict.act(
                f"{model.name} is still down: {verdict.reason}", probed=probed
            )
        case ModelState.UP:
            return RecheckVerdict.skip(f"model is up again: {verdict.reason}", probed=probed)
    return RecheckVerdict.skip(
        f"could not confirm {model.name} is down: {verdict.reason}",
        undecided=True,
        unreachable_node=verdict.unreachable_node,
        misconfiguration=verdict.misconfiguration,
        probed=probed,
    )
