"""`scripts/demo.sh`: the whole loop on this machine, narrated live (root, Linux).

Stands the loop up (testbed/loop.py: three simulated nodes, the deployment as `mlx-medic
render` writes it, Prometheus, Alertmanager, the remediator, `mlx-medic serve` as the
model's KeepAlive service), injects the seed's fault (mlx.launch and the head's rank
SIGKILLed together) and says what happens as it happens: orphans per node and state,
protection domains in use per node, alerts firing, each remediation step as it starts and
ends, the model answering again and how long it took. Then the same faults against the
seed's first fix (its ppid == 1 sweep, no remediator), and the two side by side.

    scripts/demo.sh [--faults N] [--short] [--screenshot-dir DIR]

`--screenshot-dir DIR` takes the pictures of docs/img/ from the run into DIR (see
`take_pictures`).

Everything it starts is stopped on exit, on Ctrl-C, and on a second Ctrl-C (cleanup is
not interrupted); nothing of the testbed is left.
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.browser import chromium
from testbed.loop import Loop
from testbed.loop_scenarios import Outcome, run_faults

STATES = ("running", "sleeping", "uninterruptible", "zombie", "stopped")


class Narrator:
    """Polls one loop every second and prints what changed, with seconds since start."""

    def __init__(self, title: str, started: float) -> None:
        self.title, self.started = title, started
        self.loop: Loop | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.seen: dict[str, Any] = {}
        self.stood = started  # when the loop stood

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {self.title}: {text}", flush=True)

    def attach(self, loop: Loop) -> None:
        self.loop, self.stood = loop, time.monotonic()
        self.say(
            f"the loop stands: Prometheus http://127.0.0.1:{loop.prometheus_port}/graph"
            f"?g0.expr=mlx_orphan_processes, Alertmanager"
            f" http://127.0.0.1:{loop.alertmanager_port}/"
            + (
                f", the on-call page http://127.0.0.1:{loop.remediator_port}/"
                if loop.settings.remediator
                else ""
            )
        )
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def fault(self, number: int) -> None:
        self.say(f"FAULT {number}: mlx.launch and the head's rank SIGKILLed together")

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def _watch(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self._look()
            except Exception as exc:  # a part going away at the end is no story
                self._changed("error", f"(could not look: {exc})")

    def _changed(self, key: str, text: str) -> None:
        if self.seen.get(key) != text:
            self.seen[key] = text
            self.say(text)

    def _look(self) -> None:
        loop = self.loop
        assert loop is not None
        self._changed(
            "answers", "the model answers" if loop.answers() else "the model does NOT answer"
        )
        by_state: dict[str, dict[str, int]] = {}
        for sample in loop.query('mlx_orphan_processes{model="tiny"} > 0'):
            labels = sample["metric"]
            by_state.setdefault(labels.get("node", "?"), {}).setdefault(labels.get("state", "?"), 0)
            by_state[labels.get("node", "?")][labels.get("state", "?")] += int(
                float(sample["value"][1])
            )
        orphans = (
            "; ".join(
                f"{node}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                for node, states in sorted(by_state.items())
            )
            or "none"
        )
        self._changed("orphans", f"orphans (exporters): {orphans}")
        pools = loop.pools()
        capacity = 2 * loop.sim.config.capacity  # two devices per node here
        self._changed(
            "pools",
            "protection domains in use: "
            + ", ".join(f"{n} {used}/{capacity}" for n, used in pools.items()),
        )
        firing = sorted(
            {
                a["labels"]["alertname"]
                for a in loop.prometheus("alerts")["alerts"]
                if a["state"] == "firing"
            }
        )
        self._changed("alerts", f"alerts firing: {', '.join(firing) or 'none'}")
        for run in loop.runs():
            key = f"run {run['id']}"
            self._changed(
                key,
                f"remediation run {run['id']} ({run['playbook']}, from"
                f" {run['labels'].get('alertname', run['trigger'])}):"
                f" {run['outcome']}",
            )
            for step in run["steps"]:
                self._changed(
                    f"{key} step {step['seq']}",
                    f"  step {step['name']} on {step['node']}: {step['outcome']}"
                    + (f" ({step['detail'][:120]})" if step["detail"] else ""),
                )


def contest(
    cluster: Any,
    sim: Any,
    model: Path,
    title: str,
    service: str,
    remediator: bool,
    faults: int,
    limit: float,
    started: float,
    after: Callable[[Loop, Narrator], None] | None = None,
) -> Outcome:
    """One loop and its faults, narrated; `after` sees the loop once the faults settled,
    and its narrator."""
    narrator = Narrator(title, started)
    try:
        return run_faults(
            cluster,
            sim,
            model,
            scenario=title,
            service=service,  # type: ignore[arg-type]
            remediator=remediator,
            faults=faults,
            limit=limit,
            settle=10.0,
            on_loop=narrator.attach,
            on_fault=narrator.fault,
            after=None if after is None else lambda loop: after(loop, narrator),
        )
    finally:
        narrator.close()


def take_pictures(loop: Loop, directory: Path, narrator: Narrator) -> None:
    """`--screenshot-dir`: docs/img/ from a real run, once mlx-medic is back from the
    seed's fault. Under `mlx-medic serve` that fault needs no remediator run, so on-call's
    `mlx-medic remediate` first runs the recover playbook by hand (stop, sweep every node,
    clean, start, verify: the helpers over SSH, as the service runs them), and the on-call
    page has a recover run to show. Then headless Chromium takes that page, signed in as
    on-call's browser is (`oncall-page.png`), and Prometheus's graph of the orphans over
    the run (`prometheus-orphans.png`)."""
    say = narrator.say
    say("pictures: mlx-medic remediate tiny (the recover playbook, by hand as on-call runs it)")
    done = loop.remediate()
    say(f"pictures: mlx-medic remediate exited {done.returncode}")
    if done.returncode != 0:
        say(f"pictures: {(done.stdout + done.stderr).strip()[-600:]}")
    profiles = loop.workdir / "chromium"
    profiles.mkdir(exist_ok=True)
    page = directory / "oncall-page.png"
    chromium(loop.oncall_page, profiles, f"--screenshot={page}")
    say(f"pictures: {page} ({page.stat().st_size // 1024} KiB)")
    graph = directory / "prometheus-orphans.png"
    query = 'sum by (node) (mlx_orphan_processes{model="tiny"})'
    minutes = math.ceil((time.monotonic() - narrator.stood) / 60)  # the loop's whole run
    url = (
        f"http://127.0.0.1:{loop.prometheus_port}/graph?g0.tab=0&g0.range_input={minutes}m"
        f"&g0.expr={urllib.parse.quote(query)}"
    )
    # the graph page draws with JavaScript after it loads: give its query time to answer
    chromium(url, profiles, "--virtual-time-budget=10000", f"--screenshot={graph}")
    say(f"pictures: {graph} ({graph.stat().st_size // 1024} KiB)")


def summary(outcomes: list[Outcome]) -> str:
    lines = ["", "side by side (seconds from each fault to the next good answer):"]
    for outcome in outcomes:
        seconds = ", ".join(
            "down" if f.seconds is None else f"{f.seconds:.1f}" for f in outcome.faults
        )
        pools = outcome.faults[-1].pools if outcome.faults else {}
        lines.append(
            f"  {outcome.scenario:<32} {seconds or '-':<24} domains in use at the"
            f" end {pools}, orphans left {outcome.orphans_at_end}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=3)
    parser.add_argument(
        "--short",
        action="store_true",
        help="one fault each and shorter limits (what the test runs)",
    )
    parser.add_argument(
        "--screenshot-dir",
        type=Path,
        metavar="DIR",
        help="once mlx-medic is back from the fault, run its recover playbook by hand"
        " (mlx-medic remediate) and take the on-call page and Prometheus's orphan graph"
        " into DIR as PNG (docs/img/README.md)",
    )
    args = parser.parse_args(argv)
    pictures = _picture_dir(parser, args.screenshot_dir)
    faults, limit = (1, 45.0) if args.short else (args.faults, 90.0)
    from testbed import start_cluster
    from testbed.jaccl_sim import start_jaccl_sim
    from testbed.node_users import NodeUser
    from testbed.tiny_model import make_tiny_model

    signal.signal(signal.SIGINT, _first_interrupt_only)
    workdir = Path("/var/tmp") / f"mlx-medic-demo-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    started = time.monotonic()
    outcomes: list[Outcome] = []
    try:
        print(
            "mlx-medic demo: three simulated nodes, simulated JACCL (3 domains per device),"
            " the seed's fault",
            flush=True,
        )
        model = make_tiny_model(workdir / "tiny-model")
        with start_cluster(3, workdir / "cluster", node_user=NodeUser()) as cluster:
            sim = start_jaccl_sim(cluster, on_sigkill="release", capacity=3, killable_for=20.0)
            try:
                outcomes.append(
                    contest(
                        cluster,
                        sim,
                        model,
                        "mlx-medic (serve + remediator)",
                        "serve",
                        True,
                        faults,
                        limit,
                        started,
                        after=None
                        if pictures is None
                        else lambda loop, narrator: take_pictures(loop, pictures, narrator),
                    )
                )
                # the first fix goes down once the pool is spent: two more faults show it
                outcomes.append(
                    contest(
                        cluster,
                        sim,
                        model,
                        "the seed's first fix",
                        "first-fix",
                        False,
                        faults + 2,
                        limit,
                        started,
                    )
                )
            finally:
                sim.close()
        print(summary(outcomes), flush=True)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up (a second Ctrl-C does not stop the cleanup)", flush=True)
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"cleaned up: {workdir} removed, every process the demo started ended", flush=True)


def _picture_dir(parser: argparse.ArgumentParser, directory: Path | None) -> Path | None:
    """`--screenshot-dir` made absolute and created (Chromium writes into it), or a usage
    error naming why it cannot be."""
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--screenshot-dir {directory}: {exc.strerror or exc}")
    return directory.resolve()


_interrupted = threading.Event()


def _first_interrupt_only(signum: int, frame: Any) -> None:
    """The first Ctrl-C stops the demo (everything is then cleaned up on the way out); any
    later one is said and ignored, so the cleanup always finishes."""
    if _interrupted.is_set():
        print("cleanup in progress; it ends by itself", flush=True)
        return
    _interrupted.set()
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
