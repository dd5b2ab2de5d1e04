"""The whole loop on one machine (issue 22): the seed's cascade injected into a deployment
as `mlx-medic render` writes it, three users, three nodes, simulated JACCL with pools of
3 domains per device (mode `release` here; bench/whole_loop runs both modes, longer).

Each scenario starts on freshly "rebooted" nodes and reports its numbers in the test's
output (`-s`); the assertions are the issue's goals where one run can show them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed import Cluster, processes
from testbed.faults import frozen_survivor
from testbed.jaccl_sim import JacclSim
from testbed.launch import rank_pids, start_launch
from testbed.loop import Loop, LoopSettings, start_loop
from testbed.loop_scenarios import PD_ERROR, Outcome, run_faults
from tests.exporter.test_seed_orphan import RANK_SCRIPT
from tests.loop.leftovers import listeners, off_loopback, processes_naming

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def report(outcome: Outcome) -> None:
    """Print the scenario's numbers; and nothing the loop started outlives it."""
    assert outcome.workdir is not None
    assert processes_naming(outcome.workdir) == [], f"left running: {outcome.workdir}"
    print(f"\n{outcome.scenario} ({outcome.service}, {outcome.mode}): first answer"
          f" {outcome.first_answer}, per fault {[f.seconds for f in outcome.faults]},"
          f" pools {[f.pools for f in outcome.faults]}, ledgers"
          f" {[f.ledgers for f in outcome.faults]}, orphans at end {outcome.orphans_at_end},"
          f" runs {[(r['playbook'], r['outcome']) for r in outcome.runs]},"
          f" on-call {sorted(outcome.alerts)}, last recovery {outcome.split},"
          f" dashboard orphans {sorted(set(outcome.dashboard_orphans.values()))},"
          f" alerts without a journal record {outcome.alerts_unjournaled}")  # fmt: skip
    for run in outcome.runs:
        if run["outcome"] != "succeeded":
            steps = [(s["name"], s["node"], s["outcome"], s["detail"], s["output"][-1500:])
                     for s in run["steps"]]
            print(f"  run {run['id']} {run['playbook']} {run['outcome']}: {run['detail']}"
                  f" steps {steps}")  # fmt: skip


def nothing_left_and_nothing_lost(outcome: Outcome) -> bool:
    """The dashboard's orphan panels back to zero; every alert the webhook took has its
    journal record (None: no remediator in the scenario)."""
    assert outcome.dashboard_orphans, "the dashboard has no orphan panel to read"
    return (not any(outcome.dashboard_orphans.values())
            and outcome.alerts_unjournaled in (0, None))  # fmt: skip


def no_duplicate_runs(outcome: Outcome) -> bool:
    """Never two runs for one firing (fingerprint and startsAt)."""
    firings = [(r["fingerprint"], r["starts_at"]) for r in outcome.runs
               if r["trigger_kind"] == "alert"]  # fmt: skip
    return len(firings) == len(set(firings))


def test_the_seeds_cascade_under_its_plain_start_script_is_healed_by_the_remediator(
    loop_cluster: Cluster, release_sim: JacclSim, tiny_model: Path,
):
    outcome = run_faults(loop_cluster, release_sim, tiny_model, scenario="cascade healed",
                         service="plain", faults=3)  # fmt: skip
    report(outcome)
    assert outcome.first_answer is not None, outcome.service_log[-2000:]
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert outcome.orphans_at_end == {"ai001": 0, "ai002": 0, "ai003": 0}
    assert any(r["playbook"] == "sweep-orphans" and r["outcome"] == "succeeded"
               for r in outcome.runs), outcome.runs  # fmt: skip
    assert no_duplicate_runs(outcome)
    assert nothing_left_and_nothing_lost(outcome), outcome


def test_the_seeds_first_fix_recovers_while_the_pool_lasts_then_stays_down(
    loop_cluster: Cluster, release_sim: JacclSim, tiny_model: Path,
):
    outcome = run_faults(loop_cluster, release_sim, tiny_model, scenario="first fix",
                         service="first-fix", remediator=False, faults=5, limit=45.0,
                         settle=0.0)  # fmt: skip
    report(outcome)
    assert outcome.faults and outcome.faults[0].seconds is not None  # it recovered before
    assert outcome.faults[-1].seconds is None, "the first fix should go down for good"
    assert outcome.pd_error_logged, outcome.service_log[-2000:]
    assert f"RuntimeError: [jaccl] {PD_ERROR}" in outcome.service_log


def test_the_seeds_final_fix_recovers_from_every_fault_the_anchor(
    loop_cluster: Cluster, release_sim: JacclSim, tiny_model: Path,
):
    outcome = run_faults(loop_cluster, release_sim, tiny_model, scenario="final fix",
                         service="final-fix", remediator=False, faults=2)  # fmt: skip
    report(outcome)
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert nothing_left_and_nothing_lost(outcome), outcome


def test_prevention_the_serve_wrapper_leaves_no_orphan_and_orphans_made_later_are_swept(
    loop_cluster: Cluster, release_sim: JacclSim, tiny_model: Path,
):
    """Scenarios 4 (prevention) and 7 (orphans while the model serves) on one loop: the
    seed's faults with `mlx-medic serve` as the service leave no orphan and need no
    recover run; then the seed's rank script is launched on every node and its launcher
    killed while the model serves: the orphan alert routes to sweep-orphans, the orphans
    go, and the model never stops answering."""
    script = loop_cluster.workdir / "loop-orphans" / "serve.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(RANK_SCRIPT)
    pattern = r"serve\.py --model \S+ --port {port}"  # the rank script, by the model's port
    found: dict[str, Any] = {}
    outcome = run_faults(
        loop_cluster, release_sim, tiny_model, scenario="prevention", service="serve",
        faults=2, rank_patterns=(pattern,),
        after=lambda loop: found.update(swept=orphans_while_serving(loop, script, tiny_model)))
    report(outcome)
    assert outcome.recovered_every_time, outcome.service_log[-2000:]
    assert outcome.orphans_at_end == {"ai001": 0, "ai002": 0, "ai003": 0}
    assert not [r for r in outcome.runs if r["playbook"] == "recover"], outcome.runs
    assert no_duplicate_runs(outcome)
    assert nothing_left_and_nothing_lost(outcome), outcome
    missed, runs = found["swept"]
    print(f"orphans while serving: runs {runs}, probes missed {missed}")
    assert missed == 0, "the model stopped answering while its orphans were swept"
    assert runs and {playbook for playbook, _ in runs} == {"sweep-orphans"}, runs


def orphans_while_serving(loop: Loop, script: Path, model: Path) -> tuple[int, list[Any]]:
    """Launch the seed's rank script on every node, kill its launcher, and probe the model
    every 0.5 s until the orphans are gone: (probes that failed, the runs it caused)."""
    before = {r["id"] for r in loop.runs()}
    seed = start_launch(
        loop.cluster, loop.workdir / "ring.json",
        [loop.cluster.python, str(script), "--model", str(model), "--port", str(loop.port)],
        launch_args=["--starting-port", "47600"])  # fmt: skip
    deadline = time.monotonic() + 120
    while seed.output().count("ready sum=3") < 3:
        assert seed.alive() and time.monotonic() < deadline, seed.output()
        time.sleep(0.2)
    seed.kill()  # the launcher dies; its ranks are the seed's orphans
    missed = 0
    deadline = time.monotonic() + 120
    while any(rank_pids(loop.cluster.node(n), str(script)) for n in loop.settings.nodes):
        assert time.monotonic() < deadline, f"orphans not swept:\n{loop.logs()}"
        missed += 0 if loop.answers() else 1
        time.sleep(0.5)
    return missed, [(r["playbook"], r["outcome"]) for r in loop.runs() if r["id"] not in before]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, loop: Loop) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not within {timeout:g}s:\n{loop.logs()}"
        time.sleep(0.5)
    return value


def test_jaccl_spent_the_model_serves_on_ring_and_returns_to_jaccl_after_a_reboot(
    loop_cluster: Cluster, keep_sim: JacclSim, tiny_model: Path,
):
    """Mode (b): each crash's SIGKILLed rank keeps its domains; the ledger moves the model
    to ring before the pool is gone, the ring-fallback alert fires, and once every node
    has rebooted the next start tries JACCL again by itself and serves on it."""
    with start_loop(loop_cluster, keep_sim, tiny_model, LoopSettings(service="serve")) as loop:
        assert loop.wait_answer(180) is not None, loop.logs()
        assert loop.backend() == "jaccl"
        # every server of the loop listens on a loopback address it names (Alertmanager's
        # cluster port is off): Prometheus, Alertmanager, the remediator, the exporters,
        # the model and its ranks, each node's sshd
        listening = listeners(loop.workdir, loop.cluster.workdir, tiny_model)
        ports = {port for _, port in listening}
        assert {loop.prometheus_port, loop.alertmanager_port, loop.remediator_port,
                loop.port} <= ports, listening  # fmt: skip
        assert off_loopback(listening) == {}, listening
        for _ in range(4):
            time.sleep(3)
            loop.crash()
            assert loop.wait_answer(90) is not None, loop.logs()
            if loop.backend() == "ring":
                break
        assert loop.backend() == "ring", loop.logs()
        spent = loop.pools()
        assert all(spent[n] < 2 * keep_sim.config.capacity for n in spent), spent  # never all
        (fallback, *_) = wait_for(lambda: loop.firing("MLXServingOnRingFallback"), 60,
                                  "the ring-fallback alert", loop)  # fmt: skip
        assert fallback["labels"]["model"] == "tiny"
        loop.reboot(*LoopSettings().nodes)  # pools cleared, new boot ids, the service again
        wait_for(lambda: loop.answers() and loop.backend() == "jaccl", 180,
                 "the model back on JACCL after the reboot", loop)  # fmt: skip
        print(f"\nJACCL spent: pools before the reboot {spent}, after {loop.pools()}")
        assert "jaccl smoke test" in loop.service.output() if loop.service else False


def test_the_seeds_us_survivors_the_model_serves_again_without_a_reboot_then_jaccl_after_one(
    loop_cluster: Cluster, fresh_release_sim: JacclSim, tiny_model: Path,
):
    """Ranks of a real mlx.launch of the model, crashed before mlx-medic was deployed, left
    to freeze on the peers (the seed's `Us+`): the model serves anyway, the reboot alert
    names the node and the domains held, later faults add nothing, and after the reboot
    the model is back on JACCL by itself."""
    frozen: dict[str, int] = {}

    def earlier_crashed_run(loop: Loop) -> None:
        frozen["ai002"] = frozen_survivor(
            loop.cluster, loop.sim, model=tiny_model, port=loop.port,
            hostfile=loop.workdir / "jaccl.json", starting_port=47700,
            log=loop.workdir / "earlier-run.log")  # fmt: skip

    settings = LoopSettings(service="serve", before_service=earlier_crashed_run)
    with start_loop(loop_cluster, fresh_release_sim, tiny_model, settings) as loop:
        assert loop.wait_answer(180) is not None, loop.logs()
        after_start = loop.pools()
        for _ in range(2):
            time.sleep(3)
            loop.crash()
            assert loop.wait_answer(90) is not None, loop.logs()
        later = loop.pools()  # nothing accumulates over later faults
        assert all(later[n] <= after_start[n] for n in later), (after_start, later)
        assert processes.state(frozen["ai002"]) == "D"  # the survivor is still there
        alerts = wait_for(lambda: loop.firing("MLXUnkillableSurvivors"), 120,
                          "the reboot alert", loop)  # fmt: skip
        named = {alert["labels"]["node"]: alert["annotations"]["description"] for alert in alerts}
        assert "ai002" in named, named
        assert named["ai002"].startswith("reboot ai002 to free"), named
        assert "protection domain(s)" in named["ai002"] and "tiny" in named["ai002"]
        print(f"\nUs+ survivors: pools {after_start}, backend {loop.backend()}, alerts {named}")
        loop.reboot(*LoopSettings().nodes)
        wait_for(lambda: loop.answers() and loop.backend() == "jaccl", 180,
                 "the model back on JACCL after the reboot", loop)  # fmt: skip
