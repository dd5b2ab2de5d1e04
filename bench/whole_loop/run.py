"""The whole loop against the seed's own fixes, both modes of the simulated JACCL seam.

Each scenario runs on a fresh loop (testbed/loop.py: three nodes in the three-user mode,
the deployment as `mlx-medic render` writes it, supervisord as KeepAlive behind a 3 s
throttle, an exporter per node, Debian's Prometheus and Alertmanager, the remediator)
and gets the same faults (testbed/loop_scenarios.py: mlx.launch and the head's rank
SIGKILLed together, `--serve-for` seconds after each answer):

1. `cascade healed`: the seed's plain start script, the remediator present;
2. `first fix`: the seed's ppid == 1 sweep, no remediator;
3. `final fix`: the seed's final fix (its kill -9 sweep of every node), no remediator:
   the anchor;
4. `prevention`: `mlx-medic serve` as the service, the remediator present;
5. `JACCL spent`: `serve` crashed until the ledger moves it to ring, the ring-fallback
   alert, then every node rebooted and the way back to JACCL;
6. `Us+ survivors`: a real mlx.launch of the model crashed before mlx-medic was deployed,
   its peer rank frozen, then `serve` and its faults, the reboot alert, the reboot;
7. `orphans while serving`: the seed's rank script launched on every node and its
   launcher killed while `serve` serves: the orphans swept, the model probed meanwhile.

Per fault: seconds to the next good answer ("down" past `--limit`), the domains in use
per node in the simulator's pools (the truth) and the product's ledger (its estimate);
at the end, the orphans the exporters report, and the remediator's runs. Run as root:

    .venv/bin/python bench/whole_loop/run.py --faults 4
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from testbed import Cluster, start_cluster  # noqa: E402
from testbed.jaccl_sim import start_jaccl_sim  # noqa: E402
from testbed.loop_scenarios import (  # noqa: E402
    Outcome,
    RebootOutcome,
    ServingOutcome,
    reboot_scenario,
    remediator_seconds,
    run_faults,
    serving_scenario,
)
from testbed.node_users import NodeUser  # noqa: E402
from testbed.tiny_model import make_tiny_model  # noqa: E402
from tests.exporter.test_seed_orphan import RANK_SCRIPT  # noqa: E402

SCENARIOS = {
    "cascade healed": {"service": "plain", "remediator": True},
    "first fix": {"service": "first-fix", "remediator": False},
    "final fix": {"service": "final-fix", "remediator": False},
    "prevention": {"service": "serve", "remediator": True},
}
MORE = ("JACCL spent", "Us+ survivors", "orphans while serving")


def reboot_table(outcome: RebootOutcome) -> str:
    after = zip(outcome.crashes, outcome.backends, strict=True)
    crashes = ", ".join(f"{fmt(f.seconds)} s ({backend}, {pools(f.pools)})" for f, backend in after)
    described = "; ".join(a["annotations"].get("description", "") for a in outcome.alerts)
    return "\n".join(
        [
            f"### {outcome.scenario}, mode {outcome.mode}",
            "",
            f"- first answer {fmt(outcome.first_answer)} s, domains in use then"
            f" {pools(outcome.pools_at_first_answer) if outcome.pools_at_first_answer else '-'}",
            f"- crashes: seconds to answer (backend after, domains in use): {crashes or '-'}",
            f"- `{outcome.alert}` fired {fmt(outcome.alert_after)} s after the last crash:"
            f" {described or '-'}",
            f"- before the reboot: domains in use {pools(outcome.pools_before_reboot)}"
            + (
                f", the frozen survivor in state {outcome.survivor_state_before_reboot}"
                if outcome.survivor_pid is not None
                else ""
            ),
            f"- after the reboot: back on JACCL in {fmt(outcome.back_on_jaccl)} s (its smoke"
            f" test ran: {'yes' if outcome.smoke_after_reboot else 'no'}), domains in use"
            f" {pools(outcome.pools_after)}",
        ]
    )


def serving_table(outcome: ServingOutcome) -> str:
    runs = ", ".join(f"{playbook} {result}" for playbook, result in outcome.runs) or "none"
    return "\n".join(
        [
            f"### orphans while serving, mode {outcome.mode}",
            "",
            f"- first answer {fmt(outcome.first_answer)} s; {outcome.orphans} orphans of the"
            f" seed's rank script on the three nodes; all gone {fmt(outcome.swept_after)} s after"
            f" the launcher died; the model missed {outcome.missed} of {outcome.probes} probes"
            f" meanwhile; remediator runs: {runs}",
        ]
    )


def fmt(value: float | None) -> str:
    return "down" if value is None else f"{value:.1f}"


def pools(values: dict[str, int]) -> str:
    return "/".join(str(values[n]) for n in sorted(values))


def table(outcome: Outcome) -> str:
    lines = [
        f"### {outcome.scenario} ({outcome.service}), mode {outcome.mode}",
        "",
        f"first answer {fmt(outcome.first_answer)} s",
        "",
        "| fault | seconds to answer | domains in use (ai001/ai002/ai003) | ledger |",
        "|---:|---:|---|---|",
    ]
    for number, fault in enumerate(outcome.faults, 1):
        lines.append(
            f"| {number} | {fmt(fault.seconds)} | {pools(fault.pools)} | {pools(fault.ledgers)} |"
        )
    runs = ", ".join(f"{r['playbook']} {r['outcome']}" for r in outcome.runs) or "none"
    orphans = pools(outcome.orphans_at_end) if outcome.orphans_at_end else "-"
    lines += [
        "",
        f"orphans at the end: {orphans}; remediator runs: {runs};"
        " `Couldn't allocate protection domain` in the service log:"
        f" {'yes' if outcome.pd_error_logged else 'no'}",
    ]
    if outcome.escalated_after is not None:
        lines.append(
            f"escalated (on-call paged) {fmt(outcome.escalated_after)} s after the"
            " fault it did not come back from"
        )
    own = [(r["playbook"], remediator_seconds(r)) for r in outcome.runs]
    if own:
        lines.append(
            "remediator's own time (run queued to the start command, or to the end of"
            " the last sweep; stop and SIGTERM graces excluded): "
            + ", ".join(f"{playbook} {fmt(seconds)} s" for playbook, seconds in own)
        )
    for run in outcome.runs:
        if run["playbook"] == "recover":
            steps = ", ".join(
                f"{s['name']} {fmt(s['ended_at'] - s['started_at'])} s"
                for s in run["steps"]
                if s.get("ended_at") is not None
            )
            started = [s["started_at"] for s in run["steps"] if s.get("started_at") is not None]
            first = min(started, default=None)
            before = f"re-check and lock {fmt(first - run['queued_at'])} s, " if first else ""
            lines.append(f"recover run {run['id']} ({run['outcome']}): {before}{steps}")
    shown = sorted(set(outcome.dashboard_orphans.values()))
    lines.append(
        f"dashboard orphan panels at the end: {shown}; alerts the webhook took"
        f" without a journal record: {outcome.alerts_unjournaled}"
    )
    if outcome.split:
        split = ", ".join(f"{k} {v:.1f} s" for k, v in outcome.split.items())
        lines.append(f"last recovery: {split}")
    return "\n".join(lines)


def more(
    name: str, cluster: Cluster, mode: str, model: Path, workdir: Path, args: argparse.Namespace
) -> str:
    """Scenarios 5 to 7, each with a simulator of its own (pools, frozen groups)."""
    sim = start_jaccl_sim(
        cluster,
        on_sigkill=mode,
        capacity=args.capacity,  # type: ignore[arg-type]
        killable_for=args.killable_for,
    )
    try:
        if name == "JACCL spent":
            return reboot_table(
                reboot_scenario(
                    cluster,
                    sim,
                    model,
                    scenario=name,
                    crashes=6,
                    until_ring=True,
                    alert="MLXServingOnRingFallback",
                    serve_for=args.serve_for,
                    limit=args.limit,
                )
            )
        if name == "Us+ survivors":
            return reboot_table(
                reboot_scenario(
                    cluster,
                    sim,
                    model,
                    scenario=name,
                    crashes=args.faults,
                    frozen_peer=True,
                    alert="MLXUnkillableSurvivors",
                    serve_for=args.serve_for,
                    limit=args.limit,
                )
            )
        script = workdir / "seed-rank-script" / "serve.py"
        script.parent.mkdir(exist_ok=True)
        script.write_text(RANK_SCRIPT)
        return serving_table(serving_scenario(cluster, sim, model, script))
    finally:
        sim.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--modes", default="release,keep")
    parser.add_argument("--scenarios", default=",".join((*SCENARIOS, *MORE)))
    parser.add_argument("--serve-for", type=float, default=3.0)
    parser.add_argument(
        "--limit",
        type=float,
        default=90.0,
        help="seconds to wait for an answer before calling it down",
    )
    parser.add_argument("--capacity", type=int, default=3)
    parser.add_argument("--killable-for", type=float, default=20.0)
    args = parser.parse_args()
    unknown = [s for s in args.scenarios.split(",") if s not in (*SCENARIOS, *MORE)]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: choose from {', '.join((*SCENARIOS, *MORE))}")
    workdir = Path("/var/tmp") / f"mlx-medic-bench-loop-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    outcomes: list[Outcome] = []
    try:
        model = make_tiny_model(workdir / "tiny-model")
        with start_cluster(3, workdir / "cluster", node_user=NodeUser()) as cluster:
            for mode in args.modes.split(","):
                sim = start_jaccl_sim(
                    cluster,
                    on_sigkill=mode,
                    capacity=args.capacity,  # type: ignore[arg-type]
                    killable_for=args.killable_for,
                )
                try:
                    for name in args.scenarios.split(","):
                        if name in MORE:
                            print(more(name, cluster, mode, model, workdir, args), "\n", flush=True)
                            continue
                        outcome = run_faults(
                            cluster,
                            sim,
                            model,
                            scenario=name,
                            faults=args.faults,
                            serve_for=args.serve_for,
                            limit=args.limit,
                            **SCENARIOS[name],
                        )  # type: ignore[arg-type]
                        outcomes.append(outcome)
                        print(table(outcome), "\n", flush=True)
                finally:
                    sim.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for mode in args.modes.split(","):
        medians = {}
        for outcome in outcomes:
            seconds = [f.seconds for f in outcome.faults if f.seconds is not None]
            if outcome.mode == mode and seconds:
                medians[outcome.scenario] = statistics.median(seconds)
        print(
            f"mode {mode}: median seconds to answer after a fault (faults it survived): "
            + ", ".join(f"{k} {v:.1f}" for k, v in medians.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
