"""The decision as a table: one alert, the runs in flight and what the journal says ->
the disposition, its journaled words and what it asks the engine to do. No journal, no
event loop: `decide` reads its facts from a stand-in and writes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mlx_medic.inventory.model import Model
from mlx_medic.remediator.active_run import ActiveRun
from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, Disposition, InvalidAlert
from mlx_medic.remediator.budget import BudgetDecision
from mlx_medic.remediator.config import FLAG_FOUND_BY, ConfigSource, RemediatorConfig
from mlx_medic.remediator.decision import (
    NODES_FIXED,
    PAST_LAST_CHECK,
    SWEEP_WHILE_UP,
    Decision,
    Escalation,
    Start,
    decide,
    rejection,
)
from mlx_medic.remediator.journal import ControlView
from mlx_medic.remediator.outcomes import EscalationReason
from tests.remediator.engine_fakes import MODEL, alert, fake_playbooks, make_inventory

INVENTORY = make_inventory()
PLAYBOOKS = fake_playbooks()
RECOVER, SWEEP = PLAYBOOKS["recover"], PLAYBOOKS["sweep-orphans"]
ROUTING = {"LLMModelDown": "recover", "MLXOrphanProcesses": "sweep-orphans"}
NOW = 1_700_000_000.0
STARTS = datetime.fromtimestamp(NOW - 60, UTC)
STARTS_ISO = STARTS.isoformat()

ALLOWED = BudgetDecision(True, False, 0.0, 0, "0 of 3 runs used")
BACKOFF = BudgetDecision(False, False, 30.0, 1, "backoff: 1 run(s) in the last 1h")
SPENT = BudgetDecision(False, True, 0.0, 3, "restart budget spent: 3 run(s) of the model")


def control(kind: str, model: str | None) -> ControlView:
    return ControlView(kind, model, "by hand", None, "oncall", since=0.0)


@dataclass
class Facts:
    """The journal and the clock as the decision reads them; `asked` records what it
    read, in order."""

    seen: bool = False
    clock: float = NOW
    control: ControlView | None = None
    budget_says: BudgetDecision = ALLOWED
    asked: list[str] = field(default_factory=list)

    def now(self) -> float:
        self.asked.append("now")
        return self.clock

    def firing_seen(self, key: tuple[str, str]) -> bool:
        self.asked.append("firing_seen")
        return self.seen

    def blocking_control(self, model: str) -> ControlView | None:
        self.asked.append("blocking_control")
        return self.control

    def budget(
        self, model: Model, *, playbook: str | None = None, exclude: Sequence[str] = ()
    ) -> BudgetDecision:
        self.asked.append(f"budget playbook={playbook} exclude={list(exclude)}")
        return self.budget_says


def firing(
    fingerprint: str = "f1",
    model: str | None = MODEL,
    *,
    alertname: str = "LLMModelDown",
    labels: dict[str, str] | None = None,
) -> AlertEvent:
    return alert(fingerprint, model, starts_at=STARTS, alertname=alertname, labels=labels)


def resolved(fingerprint: str = "f1", model: str | None = MODEL) -> AlertEvent:
    return alert(fingerprint, model, status=AlertStatus.RESOLVED, starts_at=STARTS)


def orphans(node: str, fingerprint: str = "o1") -> AlertEvent:
    return firing(fingerprint, alertname="MLXOrphanProcesses", labels={"node": node})


def in_flight(
    playbook: str = "recover",
    *,
    phase: str = "executing",
    fingerprints: tuple[str, ...] = ("f0",),
    nodes: tuple[str, ...] = (),
    ended: bool = False,
) -> ActiveRun:
    """The model's run 7 in this process."""
    run = ActiveRun(7, MODEL, PLAYBOOKS[playbook], False, "alert", set(fingerprints))
    run.phase, run.ended = phase, ended
    run.nodes, run.nodes_fixed = set(nodes), phase != "queued"
    return run


@dataclass(frozen=True)
class Case:
    event: AlertEvent
    disposition: Disposition
    detail: str = ""
    model: str | None = MODEL
    run: ActiveRun | None = None  # the model's run in flight
    facts: Facts = field(default_factory=Facts)
    dry_run: bool = False
    # what the decision asks besides journaling
    acts_on_run: bool = False  # joins the run (ABSORBED) or lets go of it (RESOLVED)
    cancel: str | None = None
    escalation: Escalation | None = None
    nodes: tuple[str, ...] = ()  # the model's nodes the alert names, for the run
    start: tuple[str, bool, str] | None = None  # playbook, dry run, why after run 7 ("")
    live_would: str = ""  # a dry run's start: what live mode would do


def dry_start(
    budget: BudgetDecision,
    live_would: str,
    event: AlertEvent | None = None,
    playbook: str = "recover",
    named: tuple[str, ...] = (),
) -> Case:
    """A dry run starts whatever the budget says, saying what live mode would do."""
    return Case(
        event or firing(),
        Disposition.STARTED,
        facts=Facts(budget_says=budget),
        dry_run=True,
        nodes=named,
        start=(playbook, True, ""),
        live_would=live_would,
    )


QUEUED_ALONE = in_flight(phase="queued", fingerprints=("f1",))
QUEUED_WITH_OTHERS = in_flight(phase="queued", fingerprints=("f1", "f2"))
EXECUTING = in_flight(fingerprints=("f1",))
SWEEPING = in_flight("sweep-orphans", nodes=("ai002",))
SETTLED = in_flight("sweep-orphans", nodes=("ai002",))  # past confirm-clean's last check
SETTLED.settle()
BUDGET_NEXT = (
    f"find out why {MODEL} keeps failing (`mlx-medic log --model {MODEL}`) and fix it;"
    f" then `mlx-medic resume {MODEL}`"
)

CASES = [
    # resolved
    pytest.param(
        Case(resolved(), Disposition.RESOLVED, "LLMModelDown resolved"), id="resolved, no run"
    ),
    pytest.param(
        Case(resolved(model="nope"), Disposition.RESOLVED, "LLMModelDown resolved", model=None),
        id="resolved, unknown model",
    ),
    pytest.param(
        Case(
            resolved(),
            Disposition.RESOLVED,
            "LLMModelDown resolved; cancelled queued run 7",
            run=QUEUED_ALONE,
            acts_on_run=True,
            cancel="alert f1 resolved before the run started",
        ),
        id="resolved, its queued run has no other firing: cancelled",
    ),
    pytest.param(
        Case(
            resolved(),
            Disposition.RESOLVED,
            "LLMModelDown resolved; run 7 stays queued for its other firing alerts",
            run=QUEUED_WITH_OTHERS,
            acts_on_run=True,
        ),
        id="resolved, its queued run has other firings: stays queued",
    ),
    pytest.param(
        Case(
            resolved(),
            Disposition.RESOLVED,
            "LLMModelDown resolved",
            run=EXECUTING,
            acts_on_run=True,
        ),
        id="resolved while its run executes: the run goes on",
    ),
    pytest.param(
        Case(resolved("f9"), Disposition.RESOLVED, "LLMModelDown resolved", run=EXECUTING),
        id="resolved, not an alert of the run",
    ),
    pytest.param(
        Case(
            resolved(),
            Disposition.RESOLVED,
            "LLMModelDown resolved",
            run=in_flight(phase="queued", fingerprints=("f1",), ended=True),
        ),
        id="resolved, its run already ended",
    ),
    # not ours to act on
    pytest.param(
        Case(
            firing(alertname="DiskFull"),
            Disposition.UNROUTED,
            "no playbook for alert 'DiskFull'",
            model=None,
        ),
        id="unrouted alert name",
    ),
    pytest.param(
        Case(
            firing(model="nope"),
            Disposition.UNKNOWN_MODEL,
            "label model='nope' names no model in the inventory",
            model=None,
        ),
        id="unknown model",
    ),
    pytest.param(
        Case(
            firing(model=None),
            Disposition.UNKNOWN_MODEL,
            "label model=missing names no model in the inventory",
            model=None,
        ),
        id="no model label",
    ),
    # repeats and old news
    pytest.param(
        Case(
            firing(),
            Disposition.DUPLICATE,
            f"firing since {STARTS_ISO} already handled",
            facts=Facts(seen=True),
        ),
        id="duplicate firing held by a run",
    ),
    pytest.param(
        Case(
            firing(),
            Disposition.STALE,
            "alert is 7.0h old (max_alert_age 6h): not acting on old news",
            facts=Facts(clock=STARTS.timestamp() + 7 * 3600),
        ),
        id="older than max_alert_age",
    ),
    # single flight
    pytest.param(
        Case(
            firing("f2"),
            Disposition.ABSORBED,
            "run 7 is already executing",
            run=EXECUTING,
            acts_on_run=True,
        ),
        id="a run of the model is in flight: absorbed",
    ),
    pytest.param(
        Case(
            firing("f2"),
            Disposition.ABSORBED,
            "run 7 is already queued",
            run=in_flight(phase="queued"),
            acts_on_run=True,
        ),
        id="a run of the model is queued: absorbed",
    ),
    pytest.param(
        Case(
            orphans("ai002"),
            Disposition.ABSORBED,
            "run 7 is already executing",
            run=SWEEPING,
            acts_on_run=True,
            nodes=("ai002",),
        ),
        id="orphans on a node the sweep acts on: absorbed",
    ),
    pytest.param(
        Case(
            orphans("ai003"),
            Disposition.STARTED,
            run=SWEEPING,
            nodes=("ai003",),
            start=("sweep-orphans", False, NODES_FIXED),
        ),
        id="orphans on a node the sweep does not act on: queued after it",
    ),
    pytest.param(
        Case(
            firing("f2"),
            Disposition.STARTED,
            run=SWEEPING,
            start=("recover", False, SWEEP_WHILE_UP),
        ),
        id="model down during a sweep of the serving model: queued after it",
    ),
    pytest.param(
        Case(
            orphans("ai002"),
            Disposition.STARTED,
            run=SETTLED,
            nodes=("ai002",),
            start=("sweep-orphans", False, PAST_LAST_CHECK),
        ),
        id="orphans after the sweep's last clean check: queued after it",
    ),
    pytest.param(
        Case(
            firing("f2"),
            Disposition.STARTED,
            run=in_flight(ended=True),
            start=("recover", False, ""),
        ),
        id="the model's last run ended: a new run",
    ),
    # stopped by a person or the circuit
    pytest.param(
        Case(
            firing(),
            Disposition.PAUSED,
            "pause on all models since 1970-01-01 00:00:00Z: by hand",
            facts=Facts(control=control("pause", None)),
        ),
        id="paused (all models)",
    ),
    pytest.param(
        Case(
            firing(),
            Disposition.CIRCUIT_OPEN,
            f"circuit on {MODEL} since 1970-01-01 00:00:00Z: by hand",
            facts=Facts(control=control("circuit", MODEL)),
        ),
        id="circuit open",
    ),
    # the budget
    pytest.param(
        Case(
            firing(),
            Disposition.CIRCUIT_OPEN,
            SPENT.reason,
            facts=Facts(budget_says=SPENT),
            escalation=Escalation(EscalationReason.BUDGET_SPENT, SPENT.reason, BUDGET_NEXT),
        ),
        id="budget spent: escalates, circuit open",
    ),
    pytest.param(
        Case(
            orphans("ai002"),
            Disposition.BACKOFF,
            f"sweep-orphans: {SPENT.reason}",
            facts=Facts(budget_says=SPENT),
        ),
        id="a playbook's own budget spent: backoff, no escalation",
    ),
    pytest.param(
        Case(firing(), Disposition.BACKOFF, BACKOFF.reason, facts=Facts(budget_says=BACKOFF)),
        id="within backoff",
    ),
    # a new run
    pytest.param(
        Case(firing(), Disposition.STARTED, start=("recover", False, "")),
        id="a new firing starts a run",
    ),
    pytest.param(
        dry_start(ALLOWED, "live mode would act now (0 of 3 runs used)"),
        id="dry run within the budget: says live mode would act",
    ),
    pytest.param(
        dry_start(BACKOFF, f"live mode would not act: {BACKOFF.reason}"),
        id="dry run within backoff: starts, says live mode would back off",
    ),
    pytest.param(
        dry_start(SPENT, f"live mode would not act but open the circuit and page: {SPENT.reason}"),
        id="dry run with the budget spent: starts, never escalates, says why not live",
    ),
    pytest.param(
        dry_start(
            SPENT,
            f"live mode would not act: sweep-orphans: {SPENT.reason}",
            orphans("ai002"),
            "sweep-orphans",
            ("ai002",),
        ),
        id="dry run of a playbook with its own budget spent: says live mode would not act",
    ),
]


def held(runs: dict[str, ActiveRun]) -> list[tuple[set[str], set[tuple[str, str]], set[str], str]]:
    """What the runs hold, copied: the decision must leave it as it was."""
    return [(set(r.fingerprints), set(r.firings), set(r.nodes), r.phase) for r in runs.values()]


@pytest.mark.parametrize("case", CASES)
def test_the_decision_table(case: Case) -> None:
    config = RemediatorConfig.model_validate(
        {"routing": {"playbooks": ROUTING}, "dry_run": case.dry_run}
    )
    runs = {MODEL: case.run} if case.run is not None else {}
    before = held(runs)
    decision = decide(
        case.event,
        config=config,
        inventory=INVENTORY,
        playbooks=PLAYBOOKS,
        runs=runs,
        facts=case.facts,
    )
    expected_start = None
    if case.start is not None:
        name, dry_run, why_after = case.start
        after = case.run if why_after else None
        expected_start = Start(name, PLAYBOOKS[name], dry_run, after, why_after, case.live_would)
    assert decision == Decision(
        case.disposition,
        case.detail,
        case.model,
        run=case.run if case.acts_on_run else None,
        cancel=case.cancel,
        nodes=frozenset(case.nodes),
        escalation=case.escalation,
        start=expected_start,
    )
    assert held(runs) == before  # the decision writes nothing, not even to a run


def test_a_spent_budgets_escalation_names_the_config_file_the_service_runs_with() -> None:
    config = RemediatorConfig.model_validate({"routing": {"playbooks": ROUTING}})
    given = ConfigSource(Path("/srv/medic/remediator.yml"), FLAG_FOUND_BY)
    decision = decide(
        firing(),
        config=config,
        inventory=INVENTORY,
        playbooks=PLAYBOOKS,
        runs={},
        facts=Facts(budget_says=SPENT),
        config_source=given,
    )
    assert decision.escalation is not None
    assert decision.escalation.next_action.endswith(
        f"then `mlx-medic resume {MODEL} --config.file /srv/medic/remediator.yml`"
    )
    assert f"`mlx-medic log --model {MODEL} --config.file /srv/medic/remediator.yml`" in (
        decision.escalation.next_action
    )


def test_a_started_runs_words_name_the_run_it_waits_for() -> None:
    assert Start("recover", RECOVER, False).detail(9) == "run 9 queued (recover)"
    assert Start("recover", RECOVER, True).detail(9) == "run 9 queued (recover, dry run)"
    waits = Start("recover", RECOVER, False, SWEEPING, SWEEP_WHILE_UP)
    assert waits.detail(9) == f"run 9 queued (recover) after run 7 ({SWEEP_WHILE_UP})"


@pytest.mark.parametrize(
    ("event", "runs", "facts", "asked"),
    [
        pytest.param(firing(), {}, Facts(seen=True), ["firing_seen"], id="duplicate"),
        pytest.param(
            firing("f2"), {MODEL: EXECUTING}, Facts(), ["firing_seen", "now"], id="absorbed"
        ),
        pytest.param(
            firing(),
            {},
            Facts(control=control("pause", MODEL)),
            ["firing_seen", "now", "blocking_control"],
            id="paused",
        ),
        pytest.param(
            firing(),
            {},
            Facts(),
            [
                "firing_seen",
                "now",
                "blocking_control",
                "budget playbook=None exclude=['sweep-orphans', 'reboot-node']",
            ],
            id="started: the budget without the playbooks that have their own",
        ),
        pytest.param(
            orphans("ai002"),
            {},
            Facts(),
            [
                "firing_seen",
                "now",
                "blocking_control",
                "budget playbook=sweep-orphans exclude=[]",
            ],
            id="started: a playbook's own budget",
        ),
        pytest.param(resolved(), {}, Facts(), [], id="resolved"),
    ],
)
def test_the_journal_is_read_only_as_far_as_the_rules_go(
    event: AlertEvent, runs: dict[str, ActiveRun], facts: Facts, asked: list[str]
) -> None:
    """A storm of repeats reads the journal once per delivery, never the budget."""
    config = RemediatorConfig.model_validate({"routing": {"playbooks": ROUTING}})
    decide(event, config=config, inventory=INVENTORY, playbooks=PLAYBOOKS, runs=runs, facts=facts)
    assert facts.asked == asked


@pytest.mark.parametrize(
    ("invalid", "model", "detail"),
    [
        pytest.param(
            InvalidAlert(0, "alerts[0].startsAt: bad", alertname="LLMModelDown", model=MODEL),
            MODEL,
            "alert 'LLMModelDown' is not acted on: alerts[0].startsAt: bad",
            id="a known model is journaled with it",
        ),
        pytest.param(
            InvalidAlert(1, "alerts[1].startsAt: bad", alertname="LLMModelDown", model="nope"),
            None,
            "alert 'LLMModelDown' model='nope' is not acted on: alerts[1].startsAt: bad",
            id="an unknown model is named in the words",
        ),
        pytest.param(
            InvalidAlert(2, "alerts[2]: not an object"),
            None,
            "an alert is not acted on: alerts[2]: not an object",
            id="nothing could be read",
        ),
    ],
)
def test_an_alert_that_could_not_be_read_is_invalid(
    invalid: InvalidAlert, model: str | None, detail: str
) -> None:
    assert rejection(invalid, INVENTORY) == Decision(Disposition.INVALID, detail, model)
