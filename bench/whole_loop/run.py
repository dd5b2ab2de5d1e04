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
4. `prevention`: `mlx-medic serve` as the service, the remediator present.

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

from testbed import start_cluster  # noqa: E402
from testbed.jaccl_sim import start_jaccl_sim  # noqa: E402
from testbed.loop_scenarios import Outcome, remediator_seconds, run_faults  # noqa: E402
from testbed.node_users import NodeUser  # noqa: E402
from testbed.tiny_model import make_tiny_model  # noqa: E402

SCENARIOS = {
    "cascade healed": {"service": "plain", "remediator": True},
    "first fix": {"service": "first-fix", "remediator": False},
    "final fix": {"service": "final-fix", "remediator": False},
    "prevention": {"service": "serve", "remediator": True},
}


def fmt(value: float | None) -> str:
    return "down" if value is None else f"{value:.1f}"


def pools(values: dict[str, int]) -> str:
    return "/".join(str(values[n]) for n in sorted(values))


def table(outcome: Outcome) -> str:
    lines = [f"### {outcome.scenario} ({outcome.service}), mode {outcome.mode}", "",
             f"first answer {fmt(outcome.first_answer)} s", "",
             "| fault | seconds to answer | domains in use (ai001/ai002/ai003) | ledger |",
             "|---:|---:|---|---|"]  # fmt: skip
    for number, fault in enumerate(outcome.faults, 1):
        lines.append(f"| {number} | {fmt(fault.seconds)} | {pools(fault.pools)} |"
                     f" {pools(fault.ledgers)} |")  # fmt: skip
    runs = ", ".join(f"{r['playbook']} {r['outcome']}" for r in outcome.runs) or "none"
    orphans = pools(outcome.orphans_at_end) if outcome.orphans_at_end else "-"
    lines += ["", f"orphans at the end: {orphans}; remediator runs: {runs};"
              " `Couldn't allocate protection domain` in the service log:"
              f" {'yes' if outcome.pd_error_logged else 'no'}"]  # fmt: skip
    own = [(r["playbook"], remediator_seconds(r)) for r in outcome.runs]
    if own:
        lines.append("remediator's own time (run queued to the start command, or to the end of"
                     " the last sweep; stop and SIGTERM graces excluded): "
                     + ", ".join(f"{playbook} {fmt(seconds)} s" for playbook, seconds in own))
    shown = sorted(set(outcome.dashboard_orphans.values()))
    lines.append(f"dashboard orphan panels at the end: {shown}; alerts the webhook took"
                 f" without a journal record: {outcome.alerts_unjournaled}")  # fmt: skip
    if outcome.split:
        split = ", ".join(f"{k} {v:.1f} s" for k, v in outcome.split.items())
        lines.append(f"last recovery: {split}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--modes", default="release,keep")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--serve-for", type=float, default=3.0)
    parser.add_argument("--limit", type=float, default=90.0,
                        help="seconds to wait for an answer before calling it down")
    parser.add_argument("--capacity", type=int, default=3)
    parser.add_argument("--killable-for", type=float, default=20.0)
    args = parser.parse_args()
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: choose from {', '.join(SCENARIOS)}")
    workdir = Path("/var/tmp") / f"mlx-medic-bench-loop-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    outcomes: list[Outcome] = []
    try:
        model = make_tiny_model(workdir / "tiny-model")
        with start_cluster(3, workdir / "cluster", node_user=NodeUser()) as cluster:
            for mode in args.modes.split(","):
                sim = start_jaccl_sim(cluster, on_sigkill=mode, capacity=args.capacity,  # type: ignore[arg-type]
                                      killable_for=args.killable_for)  # fmt: skip
                try:
                    for name in args.scenarios.split(","):
                        outcome = run_faults(cluster, sim, model, scenario=name,
                                             faults=args.faults, serve_for=args.serve_for,
                                             limit=args.limit, **SCENARIOS[name])  # type: ignore[arg-type]
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
        print(f"mode {mode}: median seconds to answer after a fault (faults it survived): "
              + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
