"""The whole loop's scenarios (issue 22), each run on a fresh loop (`testbed/loop.py`) and
reported as numbers: the end-to-end tests assert on them, bench/whole_loop prints them.

A fault is the seed's crash (mlx.launch and the head's rank SIGKILLed together), made
`--serve-for` seconds after the model answered. Per fault: the seconds to the next good
answer (a real one-token completion asked every 0.1 s from the host), and the domains in
use per node in the simulator's pools (the truth) beside the product's ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.cluster import Cluster
from testbed.jaccl_sim import JacclSim
from testbed.loop import Loop, LoopSettings, ServiceKind, start_loop

PD_ERROR = "Couldn't allocate protection domain"
# the seed's rank script (tests/exporter/test_seed_orphan.py), named by the model's port in
# the model's `process_patterns.rank`, so its orphans are the model's
SEED_RANK_PATTERN = r"serve\.py --model \S+ --port {port}"


@dataclass
class Fault:
    seconds: float | None  # None: no answer within the limit
    pools: dict[str, int]
    ledgers: dict[str, int]


@dataclass
class Outcome:
    scenario: str
    service: ServiceKind
    mode: str
    first_answer: float | None = None
    faults: list[Fault] = field(default_factory=list)
    orphans_at_end: dict[str, int] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    alerts: set[str] = field(default_factory=set)  # every alert on-call was sent, firing
    service_log: str = ""
    pd_error_logged: bool = False
    split: dict[str, float] = field(default_factory=dict)  # the last recovery's phases
    dashboard_orphans: dict[str, float] = field(default_factory=dict)  # each panel's query
    alerts_unjournaled: int | None = None  # webhook alerts without a journal record
    # a fault the model did not come back from: seconds from it to a remediator run's
    # escalation (on-call paged), None when none escalated
    escalated_after: float | None = None
    workdir: Path | None = None  # the loop's files (kept for a look after the test)

    @property
    def recovered_every_time(self) -> bool:
        return all(f.seconds is not None for f in self.faults)

    def last_seconds(self) -> float | None:
        return self.faults[-1].seconds if self.faults else None


def run_faults(
    cluster: Cluster,
    sim: JacclSim,
    model_dir: Path,
    *,
    scenario: str,
    service: ServiceKind,
    faults: int,
    remediator: bool = True,
    serve_for: float = 3.0,
    limit: float = 90.0,
    first_limit: float = 180.0,
    settle: float = 30.0,
    on_loop: Callable[[Loop], None] | None = None,
    on_fault: Callable[[int], None] | None = None,
    after: Callable[[Loop], None] | None = None,
    **settings: Any,
) -> Outcome:
    """Start the loop with `service` as the model's service, make `faults` seed crashes,
    let it settle, and report. A fault the model does not come back from ends the run.
    `on_loop` sees the loop once it stands, `on_fault` each fault's number as it is made
    (the demo narrates through them), `after` the loop once the faults settled."""
    outcome = Outcome(scenario, service, sim.on_sigkill)
    loop_settings = LoopSettings(service=service, remediator=remediator, **settings)
    with start_loop(cluster, sim, model_dir, loop_settings) as loop:
        outcome.workdir = loop.workdir
        if on_loop is not None:
            on_loop(loop)
        outcome.first_answer = loop.wait_answer(first_limit)
        if outcome.first_answer is not None:
            for number in range(1, faults + 1):
                time.sleep(serve_for)
                if on_fault is not None:
                    on_fault(number)
                crashed_at = time.time()
                loop.crash()
                took = loop.wait_answer(limit)
                outcome.faults.append(Fault(took, loop.pools(), loop.ledgers()))
                if took is None:
                    break
                outcome.split = recovery_split(loop, crashed_at, took)
            settle_orphans(loop, settle)
            if outcome.faults and outcome.faults[-1].seconds is None:
                outcome.escalated_after = escalated_after(loop, crashed_at)
            if after is not None:
                after(loop)
                settle_orphans(loop, settle)
        outcome.orphans_at_end = loop.orphans()
        outcome.dashboard_orphans = loop.dashboard_orphans()
        if remediator:
            outcome.alerts_unjournaled = loop.alerts_unjournaled()
        outcome.runs = loop.runs()
        outcome.alerts = loop.oncall.alertnames()
        outcome.service_log = loop.service.output() if loop.service else ""
        outcome.pd_error_logged = PD_ERROR in outcome.service_log
    return outcome


def settle_orphans(loop: Loop, timeout: float) -> None:
    """Wait until no remediator run is still under way and every exporter reported no
    orphan of the model in two scrapes in a row, none missed (or `timeout`): the outcome
    reads runs that ended, and one instant's read is not taken for the end state (a node
    whose scrape failed has no sample in it, which `Loop.orphans` reads as 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [r for r in loop.runs() if r["ended_at"] is None]
        if not running and loop.orphans_stay_zero():
            return
        time.sleep(1.0)


def escalated_after(loop: Loop, crashed_at: float) -> float | None:
    """Seconds from the fault to the end of the first run after it that escalated."""
    ended = [
        r["ended_at"]
        for r in loop.runs()
        if r["queued_at"] >= crashed_at - 1
        and r["outcome"] == "escalated"
        and r["ended_at"] is not None
    ]
    return min(ended) - crashed_at if ended else None


def recovery_split(loop: Loop, crashed_at: float, took: float) -> dict[str, float]:
    """Where the last recovery's time went, when a remediator run made it: detection
    (the fault to the alert firing in Prometheus), delivery (firing to the webhook's
    run queued), each step, and the rest (the model's load after the start)."""
    runs = [r for r in loop.runs() if r["queued_at"] >= crashed_at - 1]
    if not runs:
        return {"total": took}
    run = runs[0]
    split: dict[str, float] = {"total": took}
    fired = _timestamp(run.get("starts_at"))  # the alert's startsAt: when Prometheus fired it
    if fired is not None:
        split["detection"] = max(0.0, fired - crashed_at)
        split["delivery"] = max(0.0, run["queued_at"] - fired)
    for step in run["steps"]:
        if step.get("started_at") is not None and step.get("ended_at") is not None:
            split[f"step {step['name']}"] = step["ended_at"] - step["started_at"]
    own = remediator_seconds(run)
    if own is not None:
        split["remediator own"] = own
    return split


def remediator_seconds(run: dict[str, Any]) -> float | None:
    """The remediator's own time in a run: from the webhook's run queued to the service's
    start command (`recover`), or to the end of its last sweep (`sweep-orphans`, which
    starts nothing), less the graces it waited out as configured: the service manager's
    stop (the job's exit, up to its stop grace: the helper's `manager_seconds`) and each
    sweep's SIGTERM grace (`grace_waited`, the longest of the nodes swept at once). None
    for a run that got to neither."""
    steps = [s for s in run["steps"] if s.get("started_at") is not None]
    start = next((s for s in steps if s["name"] in ("start-service", "restart-service")), None)
    sweeps = [
        s
        for s in steps
        if s["name"] in ("sweep", "sweep-orphans") and s.get("ended_at") is not None
    ]
    if start is not None:
        end = float(start["started_at"])
    elif sweeps:
        end = float(sweeps[-1]["ended_at"])
    else:
        return None
    waited = 0.0
    for step in steps:
        if step["started_at"] >= end:
            break
        documents = _documents(step.get("output") or "")
        if step["name"] == "stop-service":
            waited += sum(float(d.get("manager_seconds") or 0) for d in documents)
        elif step["name"] in ("sweep", "sweep-orphans"):
            waited += max((float(d.get("grace_waited") or 0) for d in documents), default=0.0)
    return max(0.0, end - float(run["queued_at"]) - waited)


def _documents(output: str) -> list[dict[str, Any]]:
    """The helper documents in a step's journaled output (one JSON line per node)."""
    documents = []
    for line in output.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("document"), dict):
            documents.append(entry["document"])
    return documents


def _timestamp(stamp: str | None) -> float | None:
    from datetime import datetime

    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class RebootOutcome:
    """Scenarios 5 (JACCL spent) and 6 (the seed's `Us+` survivors): crashes on a loop
    with `mlx-medic serve`, the alert that names what is wrong, then a reboot of every
    node and the model's way back to JACCL."""

    scenario: str
    mode: str
    first_answer: float | None = None
    pools_at_first_answer: dict[str, int] = field(default_factory=dict)
    crashes: list[Fault] = field(default_factory=list)
    backends: list[str | None] = field(default_factory=list)  # after each crash
    alert: str = ""  # the alert waited for
    alert_after: float | None = None  # seconds from the last crash to it firing
    alerts: list[dict[str, Any]] = field(default_factory=list)  # as Prometheus has them
    pools_before_reboot: dict[str, int] = field(default_factory=dict)
    back_on_jaccl: float | None = None  # seconds from the reboot to answering on JACCL
    pools_after: dict[str, int] = field(default_factory=dict)
    smoke_after_reboot: bool = False  # the JACCL smoke test ran again
    survivor_pid: int | None = None
    survivor_state_before_reboot: str | None = None


def reboot_scenario(
    cluster: Cluster,
    sim: JacclSim,
    model_dir: Path,
    *,
    scenario: str,
    crashes: int,
    alert: str,
    until_ring: bool = False,
    frozen_peer: bool = False,
    serve_for: float = 3.0,
    limit: float = 90.0,
    alert_limit: float = 120.0,
    back_limit: float = 180.0,
    on_answer: Callable[[Loop], None] | None = None,
) -> RebootOutcome:
    """`crashes` seed faults against `mlx-medic serve` (fewer when `until_ring` and the
    wrapper moved to ring), with a real mlx.launch of the model crashed before mlx-medic
    was deployed and its peer rank left to freeze when `frozen_peer`; then `alert` must
    fire, every node reboots, and the model must come back on JACCL by itself.
    `on_answer` sees the loop once the model first answers."""
    from testbed import processes
    from testbed.faults import frozen_survivor

    outcome = RebootOutcome(scenario, sim.on_sigkill, alert=alert)

    def earlier_crashed_run(loop: Loop) -> None:
        outcome.survivor_pid = frozen_survivor(
            loop.cluster,
            loop.sim,
            model=model_dir,
            port=loop.port,
            hostfile=loop.workdir / "jaccl.json",
            starting_port=47700,
            log=loop.workdir / "earlier-run.log",
        )

    settings = LoopSettings(
        service="serve", before_service=earlier_crashed_run if frozen_peer else None
    )
    with start_loop(cluster, sim, model_dir, settings) as loop:
        outcome.first_answer = loop.wait_answer(2 * back_limit)
        if outcome.first_answer is None:
            return outcome
        outcome.pools_at_first_answer = loop.pools()
        if on_answer is not None:
            on_answer(loop)
        for _ in range(crashes):
            time.sleep(serve_for)
            loop.crash()
            took = loop.wait_answer(limit)
            outcome.crashes.append(Fault(took, loop.pools(), loop.ledgers()))
            outcome.backends.append(loop.backend())
            if took is None or (until_ring and loop.backend() == "ring"):
                break
        crashed = time.monotonic()
        while time.monotonic() - crashed < alert_limit:
            if firing := loop.firing(alert):
                outcome.alert_after = time.monotonic() - crashed
                outcome.alerts = firing
                break
            time.sleep(0.5)
        outcome.pools_before_reboot = loop.pools()
        if outcome.survivor_pid is not None:
            outcome.survivor_state_before_reboot = processes.state(outcome.survivor_pid)
        rebooted = time.monotonic()
        loop.reboot(*settings.nodes)
        while time.monotonic() - rebooted < back_limit:
            if loop.answers() and loop.backend() == "jaccl":
                outcome.back_on_jaccl = time.monotonic() - rebooted
                break
            time.sleep(0.5)
        outcome.pools_after = loop.pools()
        output = loop.service.output() if loop.service else ""
        outcome.smoke_after_reboot = "jaccl smoke test" in output
    return outcome


@dataclass
class ServingOutcome:
    """Scenario 7: orphans made while the model serves."""

    mode: str
    first_answer: float | None = None
    orphans: int = 0  # the seed's ranks left behind, on every node
    swept_after: float | None = None  # seconds from the launcher's death to none left
    probes: int = 0  # health probes while they were swept
    missed: int = 0  # of those, the ones the model did not answer
    runs: list[tuple[str, str]] = field(default_factory=list)  # (playbook, outcome)


def orphans_while_serving(
    loop: Loop,
    script: Path,
    model_dir: Path,
    outcome: ServingOutcome | None = None,
    limit: float = 120.0,
) -> ServingOutcome:
    """Launch the seed's rank script (`script`, started with the model's port) on every
    node of a serving loop, kill its launcher, and probe the model every 0.5 s until the
    orphans are gone."""
    from testbed.launch import rank_pids, start_launch

    outcome = outcome or ServingOutcome(loop.sim.on_sigkill)
    before = {r["id"] for r in loop.runs()}
    seed = start_launch(
        loop.cluster,
        loop.workdir / "ring.json",
        [loop.cluster.python, str(script), "--model", str(model_dir), "--port", str(loop.port)],
        launch_args=["--starting-port", "47600"],
    )
    deadline = time.monotonic() + limit
    while seed.output().count("ready sum=3") < 3:
        if not seed.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the seed's rank script did not start:\n{seed.output()}")
        time.sleep(0.2)
    outcome.orphans = sum(
        len(rank_pids(loop.cluster.node(n), str(script))) for n in loop.settings.nodes
    )
    seed.kill()  # the launcher dies; its ranks are the seed's orphans
    killed = time.monotonic()
    while any(rank_pids(loop.cluster.node(n), str(script)) for n in loop.settings.nodes):
        if time.monotonic() - killed > limit:
            break
        outcome.probes += 1
        outcome.missed += 0 if loop.answers() else 1
        time.sleep(0.5)
    else:
        outcome.swept_after = time.monotonic() - killed
    settle_orphans(loop, 30.0)
    outcome.runs = [(r["playbook"], r["outcome"]) for r in loop.runs() if r["id"] not in before]
    return outcome


def serving_scenario(
    cluster: Cluster, sim: JacclSim, model_dir: Path, script: Path
) -> ServingOutcome:
    """Scenario 7 on a loop of its own: `mlx-medic serve`, the remediator, and the seed's
    rank `script`, which the model's rank pattern names (its orphans are the model's)."""
    outcome = ServingOutcome(sim.on_sigkill)
    settings = LoopSettings(service="serve", rank_patterns=(SEED_RANK_PATTERN,))
    with start_loop(cluster, sim, model_dir, settings) as loop:
        outcome.first_answer = loop.wait_answer(180.0)
        if outcome.first_answer is not None:
            orphans_while_serving(loop, script, model_dir, outcome)
    return outcome


__all__ = [
    "PD_ERROR",
    "SEED_RANK_PATTERN",
    "Fault",
    "Outcome",
    "RebootOutcome",
    "ServingOutcome",
    "orphans_while_serving",
    "reboot_scenario",
    "recovery_split",
    "remediator_seconds",
    "run_faults",
    "serving_scenario",
    "settle_orphans",
]
