"""The whole loop on one machine (issue 22): the seed's cascade injected into a deployment
as `mlx-medic render` writes it, three users, three nodes, simulated JACCL with pools of
3 domains per device (mode `release` here; bench/whole_loop runs both modes, longer).

Each scenario starts on freshly "rebooted" nodes and reports its numbers in the test's
output (`-s`); the assertions are the issue's goals where one run can show them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed import Cluster
from testbed.jaccl_sim import JacclSim
from testbed.loop import Loop
from testbed.loop_scenarios import (
    PD_ERROR,
    SEED_RANK_PATTERN,
    Outcome,
    ServingOutcome,
    orphans_while_serving,
    reboot_scenario,
    run_faults,
)
from tests.exporter.test_seed_orphan import RANK_SCRIPT
from tests.loop.leftovers import listeners, off_loopback, processes_naming

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def report(outcome: Outcome) -> None:
    """Print the scenario's numbers; and nothing the loop started outlives it."""
    assert outcome.workdir is not None
    assert processes_naming(outcome.workdir) == [], f"left running: {outcome.workdir}"
    print(
        f"\n{outcome.scenario} ({outcome.service}, {outcome.mode}): first answer"
        f" {outcome.first_answer}, per fault {[f.seconds for f in outcome.faults]},"
        f" pools {[f.pools for f in outcome.faults]}, ledgers"
        f" {[f.ledgers for f in outcome.faults]}, orphans at end {outcome.orphans_at_end},"
        f" runs {[(r['playbook'], r['outcome']) for r in outcome.runs]},"
        f" on-call {sorted(outcome.alerts)}, last recovery {outcome.split},"
        f" dashboard orphans {sorted(set(outcome.dashboard_orphans.values()))},"
        f" alerts without a journal record {outcome.alerts_unjournaled}"
    )
    for run in outcome.runs:
        if run["outcome"] != "succeeded":
            steps = [
                (s["name"], s["node"], s["outcome"], s["detail"], s["output"][-1500:])
                for s in run["steps"]
            ]
            print(
                f"  run {run['id']} {run['playbook']} {run['outcome']}: {run['detail']}"
                f" steps {steps}"
            )


def nothing_left_and_nothing_lost(outcome: Outcome) -> bool:
    """The dashboard's orphan panels back to zero; every alert the webhook took has its
    journal record (None: no remediator in the scenario)."""
    assert outcome.dashboard_orphans, "the dashboard has no orphan panel to read"
    return not any(outcome.dashboard_orphans.values()) and outcome.alerts_unjournaled in (0, None)


def no_duplicate_runs(outcome: Outcome) -> bool:
    """Never two runs for one firing (fingerprint and startsAt)."""
    firings = [
        (r["fingerprint"], r["starts_at"]) for r in outcome.runs if r["trigger_kind"] == "alert"
    ]
    return len(firings) == len(set(firings))


def test_the_seeds_cascade_under_its_plain_start_script_is_healed_by_the_remediator(
    loop_cluster: Cluster,
    release_sim: JacclSim,
    tiny_model: Path,
):
    outcome = run_faults(
        loop_cluster, release_sim, tiny_model, scenario="cascade healed", service="plain", faults=3
    )
    report(outcome)
    assert outcome.first_answer is not None, outcome.service_log[-2000:]
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert outcome.orphans_at_end == {"ai001": 0, "ai002": 0, "ai003": 0}
    assert any(
        r["playbook"] == "sweep-orphans" and r["outcome"] == "succeeded" for r in outcome.runs
    ), outcome.runs
    assert no_duplicate_runs(outcome)
    assert nothing_left_and_nothing_lost(outcome), outcome


def test_the_seeds_first_fix_recovers_while_the_pool_lasts_then_stays_down(
    loop_cluster: Cluster,
    release_sim: JacclSim,
    tiny_model: Path,
):
    outcome = run_faults(
        loop_cluster,
        release_sim,
        tiny_model,
        scenario="first fix",
        service="first-fix",
        remediator=False,
        faults=5,
        limit=30.0,
        settle=0.0,
    )
    report(outcome)
    assert outcome.faults and outcome.faults[0].seconds is not None  # it recovered before
    assert outcome.faults[-1].seconds is None, "the first fix should go down for good"
    assert outcome.pd_error_logged, outcome.service_log[-2000:]
    assert f"RuntimeError: [jaccl] {PD_ERROR}" in outcome.service_log


def test_the_seeds_final_fix_recovers_from_every_fault_the_anchor(
    loop_cluster: Cluster,
    release_sim: JacclSim,
    tiny_model: Path,
):
    outcome = run_faults(
        loop_cluster,
        release_sim,
        tiny_model,
        scenario="final fix",
        service="final-fix",
        remediator=False,
        faults=2,
    )
    report(outcome)
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert nothing_left_and_nothing_lost(outcome), outcome


def test_prevention_the_serve_wrapper_leaves_no_orphan_and_orphans_made_later_are_swept(
    loop_cluster: Cluster,
    release_sim: JacclSim,
    tiny_model: Path,
):
    """Scenarios 4 (prevention) and 7 (orphans while the model serves) on one loop: the
    seed's faults with `mlx-medic serve` as the service leave no orphan and need no
    recover run; then the seed's rank script is launched on every node and its launcher
    killed while the model serves: the orphan alert routes to sweep-orphans, the orphans
    go, and the model never stops answering."""
    script = seed_rank_script(loop_cluster)
    found: dict[str, ServingOutcome] = {}
    outcome = run_faults(
        loop_cluster,
        release_sim,
        tiny_model,
        scenario="prevention",
        service="serve",
        faults=2,
        rank_patterns=(SEED_RANK_PATTERN,),
        after=lambda loop: found.update(swept=orphans_while_serving(loop, script, tiny_model)),
    )
    report(outcome)
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert outcome.orphans_at_end == {"ai001": 0, "ai002": 0, "ai003": 0}
    assert not [r for r in outcome.runs if r["playbook"] == "recover"], outcome.runs
    assert no_duplicate_runs(outcome)
    assert nothing_left_and_nothing_lost(outcome), outcome
    swept = found["swept"]
    print(f"orphans while serving: {swept}")
    assert swept.orphans >= 3 and swept.swept_after is not None, swept
    assert swept.missed == 0, "the model stopped answering while its orphans were swept"
    assert swept.runs and {playbook for playbook, _ in swept.runs} == {"sweep-orphans"}, swept


def seed_rank_script(cluster: Cluster) -> Path:
    """The seed's rank script (tests/exporter/test_seed_orphan.py), in the cluster's dir."""
    script = cluster.workdir / "loop-orphans" / "serve.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(RANK_SCRIPT)
    return script


def test_jaccl_spent_the_model_serves_on_ring_and_returns_to_jaccl_after_a_reboot(
    loop_cluster: Cluster,
    keep_sim: JacclSim,
    tiny_model: Path,
):
    """Mode (b): each crash's SIGKILLed rank keeps its domains; the ledger moves the model
    to ring before the pool is gone, the ring-fallback alert fires, and once every node
    has rebooted the next start tries JACCL again by itself and serves on it."""
    seen: dict[str, Any] = {}

    def on_answer(loop: Loop) -> None:
        seen["backend"] = loop.backend()
        # every server of the loop listens on a loopback address it names (Alertmanager's
        # cluster port is off): Prometheus, Alertmanager, the remediator, the exporters,
        # the model and its ranks, each node's sshd
        seen["listening"] = listeners(loop.workdir, loop.cluster.workdir, tiny_model)
        seen["ports"] = {
            loop.prometheus_port,
            loop.alertmanager_port,
            loop.remediator_port,
            loop.port,
        }

    outcome = reboot_scenario(
        loop_cluster,
        keep_sim,
        tiny_model,
        scenario="JACCL spent",
        crashes=4,
        until_ring=True,
        alert="MLXServingOnRingFallback",
        on_answer=on_answer,
    )
    print(f"\n{outcome}")
    assert outcome.first_answer is not None
    assert seen["backend"] == "jaccl"
    listening = seen["listening"]
    assert seen["ports"] <= {port for _, port in listening}, listening
    assert off_loopback(listening) == {}, listening
    assert all(f.seconds is not None for f in outcome.crashes), outcome.crashes
    assert outcome.backends[-1] == "ring", outcome
    spent = outcome.pools_before_reboot
    assert all(spent[n] < 2 * keep_sim.config.capacity for n in spent), spent  # never all
    (fallback, *_) = outcome.alerts
    assert fallback["labels"]["model"] == "tiny"
    assert outcome.back_on_jaccl is not None, outcome
    assert outcome.smoke_after_reboot


def test_the_seeds_us_survivors_the_model_serves_again_without_a_reboot_then_jaccl_after_one(
    loop_cluster: Cluster,
    fresh_release_sim: JacclSim,
    tiny_model: Path,
):
    """Ranks of a real mlx.launch of the model, crashed before mlx-medic was deployed, left
    to freeze on the peers (the seed's `Us+`): the model serves anyway, the reboot alert
    names the node and the domains held, later faults add nothing, and after the reboot
    the model is back on JACCL by itself."""
    outcome = reboot_scenario(
        loop_cluster,
        fresh_release_sim,
        tiny_model,
        scenario="Us+ survivors",
        crashes=2,
        frozen_peer=True,
        alert="MLXUnkillableSurvivors",
    )
    print(f"\n{outcome}")
    assert outcome.first_answer is not None
    assert all(f.seconds is not None for f in outcome.crashes), outcome.crashes
    later, after_start = outcome.crashes[-1].pools, outcome.pools_at_first_answer
    assert all(later[n] <= after_start[n] for n in later), (after_start, later)
    assert outcome.survivor_state_before_reboot == "D"  # the survivor was still there
    named = {a["labels"]["node"]: a["annotations"]["description"] for a in outcome.alerts}
    assert "ai002" in named, named
    assert named["ai002"].startswith("reboot ai002 to free"), named
    assert "protection domain(s)" in named["ai002"] and "tiny" in named["ai002"]
    assert outcome.back_on_jaccl is not None, outcome
