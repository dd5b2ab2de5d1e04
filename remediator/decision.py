"""The decision: what one alert means (its `Disposition`), the journal's words for it,
and the one thing it asks of the engine besides journaling it (join a run, cancel a
queued one, escalate, queue a new run). It writes nothing and awaits nothing: it reads
the journal and the clock only through `Facts`, each asked only when a rule needs it,
so it can be table-tested and concurrent deliveries cannot interleave in it.
`Engine.submit` journals the decision and does what it asks.

The order of the rules is the safety argument:

  (an alert that could not be read -> `Engine.reject`: journaled with its reason, INVALID)
  resolved -> journal, cancel a still-queued run of that alert
  unrouted alert name / unknown model -> journal, ignore (a node-scoped playbook's
    alert, reboot-node's, names a node: its run is the first model's placed there; an
    unknown node, a node without models or one the playbook declines is not acted on)
  same firing (fingerprint, startsAt) held by a run, durably -> DUPLICATE
  older than max_alert_age -> STALE
  a run for the model queued or running -> ABSORBED (single flight), except that a
    new run is queued after it (through the rules below) for a model-down alert while
    the run acts on a serving model (sweep-orphans), for an alert naming a node the run
    does not act on (sweep-orphans acts on the nodes named before it started), and for
    any alert once the run has checked its nodes for the last time (sweep-orphans past
    confirm-clean's last clean check: a new firing then would be held, never acted on)
  paused / circuit open -> PAUSED / CIRCUIT_OPEN
  a dry run -> a new run, STARTED, whatever the budget says: the run journals what live
    mode would do by the two rules below (act, back off, or open the circuit)
  budget spent -> escalate, CIRCUIT_OPEN (a playbook with a budget of its own, such as
    sweep-orphans: BACKOFF, no escalation); within backoff -> BACKOFF
  else -> a new run, STARTED

Dedupe exists to stop repeats of a firing whose run is queued or running, or whose run
succeeded (a dry run: planned). A firing is held by the run it started or joined, and
only while that run is in flight or after it succeeded. Every other ending (locked,
unreachable, inconclusive, skipped, escalated, failed, interrupted, cancelled) did not
fix the model, so it lets go of its firings (`Journal.end_run`): Alertmanager's next
notification of the same firing starts a new run, within the budget and backoff; a
PAUSED, CIRCUIT_OPEN or BACKOFF decision never holds a firing at all. So after
`mlx-medic resume`, the next re-notification acts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from mlx_medic.inventory.model import Model
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.active_run import ActiveRun
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition, InvalidAlert
from mlx_medic.remediator.budget import Budget, BudgetDecision, resume_hint
from mlx_medic.remediator.config import ConfigSource, RemediatorConfig, command_line
from mlx_medic.remediator.journal import ControlView, Journal
from mlx_medic.remediator.outcomes import EscalationReason
from mlx_medic.remediator.playbooks import Playbook

SWEEP_WHILE_UP = "a model-down alert waits for the sweep of a serving model, then acts"
NODES_FIXED = "that run acts only on the nodes it started with"
PAST_LAST_CHECK = "that run has checked its nodes for the last time and would not act on this alert"
# The one STARTED that turns DUPLICATE after the decision: the journal's insert lost a race.
RECORDED_ELSEWHERE = "firing recorded by another process"


class Facts(Protocol):
    """What the rules read beyond the alert and the runs in flight (the journal, the
    clock); each is asked only when a rule needs it (a storm of duplicates reads no
    budget)."""

    def now(self) -> float: ...

    def firing_seen(self, key: tuple[str, str]) -> bool:
        """Whether a run holds this firing (fingerprint, startsAt)."""
        ...

    def blocking_control(self, model: str) -> ControlView | None:
        """The pause or open circuit that stops automatic action on the model."""
        ...

    def budget(
        self, model: Model, *, playbook: str | None = None, exclude: Sequence[str] = ()
    ) -> BudgetDecision:
        """`Budget.check`: the model's restart budget and backoff."""
        ...


@dataclass
class JournalFacts:
    """The facts as the engine has them (the only part of this module that reads):
    its cache of firings held before the journal, the budget and the clock."""

    journal: Journal
    budgets: Budget
    clock: Callable[[], float]
    seen: Mapping[tuple[str, str], None]

    def now(self) -> float:
        return self.clock()

    def firing_seen(self, key: tuple[str, str]) -> bool:
        return key in self.seen or self.journal.firing_seen(*key)

    def blocking_control(self, model: str) -> ControlView | None:
        return self.journal.blocking_control(model)

    def budget(
        self, model: Model, *, playbook: str | None = None, exclude: Sequence[str] = ()
    ) -> BudgetDecision:
        return self.budgets.check(model, playbook=playbook, exclude=exclude)


class Escalation(NamedTuple):
    reason: EscalationReason
    detail: str
    next_action: str


@dataclass(frozen=True)
class Start:
    """A new run to queue (STARTED); its run id comes from the journal."""

    playbook_name: str
    playbook: Playbook
    dry_run: bool
    after: ActiveRun | None = None  # the run of the model it waits for, if any
    why_after: str = ""
    live_would: str = ""  # a dry run: what live mode would do (budget, backoff, circuit)

    def detail(self, run_id: int) -> str:
        """The STARTED event's words, once the journal gave the run its id."""
        dry = ", dry run" if self.dry_run else ""
        after = f" after run {self.after.run_id} ({self.why_after})" if self.after else ""
        return f"run {run_id} queued ({self.playbook_name}{dry}){after}"


@dataclass(frozen=True)
class Decision:
    """One alert's disposition and the journal's detail for it, and what else to do."""

    disposition: Disposition
    detail: str = ""  # STARTED: `start.detail(run_id)`
    model: str | None = None  # the inventory's model the event is journaled with
    run: ActiveRun | None = None  # ABSORBED: the run it joins; RESOLVED: the one it leaves
    cancel: str | None = None  # RESOLVED: why `run` (queued, no firing left) is cancelled
    nodes: frozenset[str] = frozenset()  # the model's nodes the alert names (empty: all)
    escalation: Escalation | None = None  # CIRCUIT_OPEN by a spent budget: tell on-call
    start: Start | None = None  # STARTED: the run to queue


def known_model(inventory: Inventory, name: str | None) -> Model | None:
    if name is None:
        return None
    try:
        return inventory.model(name)
    except KeyError:
        return None


def decide(
    event: AlertEvent,
    *,
    config: RemediatorConfig,
    inventory: Inventory,
    playbooks: Mapping[str, Playbook],
    runs: Mapping[str, ActiveRun],
    facts: Facts,
    config_source: ConfigSource | None = None,
) -> Decision:
    """What `event` means, by the rules in the order of the module's docstring. `runs`:
    this process's run of each model (the latest, possibly ended); `config_source`: the
    service's config file, which the commands in an escalation's next action name."""
    label = config.routing.model_label
    model_name = event.labels.get(label)
    playbook_name = config.routing.playbooks.get(event.alertname)
    playbook = playbooks[playbook_name] if playbook_name is not None else None
    if playbook is not None and playbook.node_scoped:
        model_name, declined = _node_model(event.labels.get("node"), playbook, inventory)
        if declined is not None and event.status != AlertStatus.RESOLVED:
            return declined
    model = known_model(inventory, model_name)

    if event.status == AlertStatus.RESOLVED:
        return _resolved(event, model, runs)

    if playbook_name is None or playbook is None:
        return Decision(Disposition.UNROUTED, f"no playbook for alert {event.alertname[:100]!r}")
    if model is None:
        shown = "missing" if model_name is None else repr(model_name[:100])
        return Decision(
            Disposition.UNKNOWN_MODEL, f"label {label}={shown} names no model in the inventory"
        )

    key = event.dedupe_key
    if facts.firing_seen(key):
        return Decision(Disposition.DUPLICATE, f"firing since {key[1]} already handled", model.name)

    age = facts.now() - event.starts_at.timestamp()
    if age > config.max_alert_age:
        return Decision(
            Disposition.STALE,
            f"alert is {age / 3600:.1f}h old (max_alert_age"
            f" {config.max_alert_age / 3600:g}h): not acting on old news",
            model.name,
        )

    node_label = event.labels.get("node")
    named = frozenset({node_label}) if node_label in model.nodes else frozenset()
    current = runs.get(model.name)
    # A model that is down is not absorbed by a run that acts on it while it serves, nor
    # an alert naming a node the run will not act on, nor any alert once the run has
    # checked its nodes for the last time: its run is queued after it.
    waits_for, why_after = None, ""
    if current is not None and not current.ended:
        if current.playbook.while_up and not playbook.while_up:
            waits_for, why_after = current, SWEEP_WHILE_UP
        elif current.settled:
            waits_for, why_after = current, PAST_LAST_CHECK
        elif not current.covers(named):
            waits_for, why_after = current, NODES_FIXED
        else:
            return Decision(
                Disposition.ABSORBED,
                f"run {current.run_id} is already {current.phase}",
                model.name,
                run=current,
                nodes=named,
            )

    control = facts.blocking_control(model.name)
    if playbook.node_scoped and control is not None and control.kind == "pause":
        control = None  # its run's re-check judges the pauses of every model on the node
    if control is not None:
        paused = control.kind == "pause"
        scope = "all models" if control.model is None else model.name
        return Decision(
            Disposition.PAUSED if paused else Disposition.CIRCUIT_OPEN,
            f"{control.kind} on {scope} since"
            f" {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(control.since))}:"
            f" {control.reason}".rstrip(": "),
            model.name,
        )

    dry_run = config.dry_run
    own = [name for name, p in playbooks.items() if p.own_budget]
    budget = (
        facts.budget(model, playbook=playbook_name)
        if playbook.own_budget
        else facts.budget(model, exclude=own)
    )
    if not dry_run:  # a dry run starts whatever the budget says (`live_would` says it)
        if budget.spent and playbook.own_budget:  # never opens recover's circuit
            return Decision(Disposition.BACKOFF, f"{playbook_name}: {budget.reason}", model.name)
        if budget.spent:
            escalation = Escalation(
                EscalationReason.BUDGET_SPENT,
                budget.reason,
                f"find out why {model.name} keeps failing"
                f" (`{command_line(config_source, 'log', '--model', model.name)}`) and fix"
                f" it; {resume_hint(model.name, config_source)}",
            )
            return Decision(
                Disposition.CIRCUIT_OPEN, budget.reason, model.name, escalation=escalation
            )
        if not budget.allowed:
            return Decision(Disposition.BACKOFF, budget.reason, model.name)

    live_would = _live_would(budget, playbook_name, playbook.own_budget) if dry_run else ""
    start = Start(playbook_name, playbook, dry_run, waits_for, why_after, live_would)
    return Decision(Disposition.STARTED, model=model.name, nodes=named, start=start)


def _node_model(
    node: str | None, playbook: Playbook, inventory: Inventory
) -> tuple[str | None, Decision | None]:
    """A node-scoped playbook's alert: the model its run is journaled under (the first
    placed on the node), or the decision that starts none (an unknown node, no model
    there, the playbook declines the node)."""
    names = [n.name for n in inventory.nodes]
    if node not in names:
        shown = "missing" if node is None else repr(node[:100])
        return None, Decision(
            Disposition.UNKNOWN_MODEL, f"label node={shown} names no node in the inventory"
        )
    placed = inventory.models_on(node)
    if not placed:
        return None, Decision(Disposition.UNROUTED, f"no model is placed on {node}")
    declined = playbook.declines(node, inventory)
    if declined is not None:
        return placed[0].name, Decision(Disposition.UNROUTED, declined, placed[0].name)
    return placed[0].name, None


def _live_would(budget: BudgetDecision, playbook_name: str, own_budget: bool) -> str:
    """What a live run would do where a dry run starts, by the rules above."""
    if budget.spent and own_budget:
        return f"live mode would not act: {playbook_name}: {budget.reason}"
    if budget.spent:
        return f"live mode would not act but open the circuit and page: {budget.reason}"
    if not budget.allowed:
        return f"live mode would not act: {budget.reason}"
    return f"live mode would act now ({budget.reason})"


def _resolved(event: AlertEvent, model: Model | None, runs: Mapping[str, ActiveRun]) -> Decision:
    """A resolved alert lets go of its run; a queued run left with no firing is cancelled."""
    detail = f"{event.alertname} resolved"
    name = model.name if model else None
    run = runs.get(model.name) if model else None
    if run is None or run.ended or event.fingerprint not in run.fingerprints:
        return Decision(Disposition.RESOLVED, detail, name)
    cancel = None
    if run.phase == "queued" and run.fingerprints == {event.fingerprint}:
        cancel = f"alert {event.fingerprint} resolved before the run started"
        detail += f"; cancelled queued run {run.run_id}"
    elif run.phase == "queued":
        detail += f"; run {run.run_id} stays queued for its other firing alerts"
    return Decision(Disposition.RESOLVED, detail, name, run=run, cancel=cancel)


def rejection(invalid: InvalidAlert, inventory: Inventory) -> Decision:
    """An alert that could not be read: INVALID, with what could be read of it."""
    named = invalid.model if known_model(inventory, invalid.model or None) else None
    parts = []
    if invalid.alertname:
        parts.append(f"alert {invalid.alertname[:100]!r}")
    if invalid.model and named is None:
        parts.append(f"model={invalid.model[:100]!r}")
    what = " ".join(parts) or "an alert"
    return Decision(Disposition.INVALID, f"{what} is not acted on: {invalid.reason}", named)
