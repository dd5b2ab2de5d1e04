"""A node that fails a `recover` run once its sweep has begun, on the testbed over real SSH
and the real node helpers (this checkout's): the model down, its supervisord program
stopped; the peer's mlx-medic (its inventory `medic_command`) is a script in the test's dir
that runs the real one, except its `node sweep` helper, which hangs (the real command line,
its work a wait on a child that never ends), or waits until the test has frozen every
sshd process of the peer. Either way the run ends within its timeouts, escalates saying
the node's sweep timed out, and nothing is started on top of what the sweep may have
left; a hung helper ends itself and its child on the node at its time limit (the call's
own), with nobody signalling it. The helpers run as a process per call here
(`ssh.helper_sessions: false`, as for a node that opens no helper session), so the peer's
script sees each call; through a session, the same faults are
tests/remediator/test_transport_ssh.py's (a frozen node) and tests/node/test_helper_session.py's
(a request past its time limit)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import RunView
from mlx_medic.transport import SshTransport
from testbed import Cluster, processes
from testbed.freezer import frozen
from tests.node.inventories import CHECKOUT, checkout_medic
from tests.node.test_sweep_clean_testbed import wait_until
from tests.remediator.engine_fakes import alert
from tests.remediator.test_recover_testbed import start_engine
from tests.serve.scenario import Served, prepare, start_supervisord

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

COMMAND_TIMEOUT = 8.0  # the inventory's ssh.command_timeout: a node helper's time to answer
KILL_GRACE = 2.0  # the sweep's wait between SIGTERM and SIGKILL, added to its helper's time

# The peer's mlx-medic: the real one, except `node sweep`, which first writes its pid (as
# the node sees it) to STARTED, then runs BODY.
PEER_MEDIC = """\
#!/bin/sh
export PYTHONPATH={checkout}
if [ "$1 $2" = "node sweep" ]; then
    echo $$ > {started}
{body}
fi
exec {medic} "$@"
"""
HANGS = '    exec {python} {hung_sweep} "$@"'  # the helper's own process, stuck for good
WAITS_FOR_GO = "    while [ ! -e {go} ]; do sleep 0.1; done"  # then the real sweep
# The real `mlx-medic node sweep` command line (its time limit too), its work a wait on a
# child of its own that never ends, whose pid (as the node sees it) goes to CHILD.
HUNG_SWEEP = """\
import subprocess, sys
from pathlib import Path

from mlx_medic.node import sweep_cli


def hang(args):
    child = subprocess.Popen(["sleep", "3600"])
    Path({child!r}).write_text(str(child.pid))
    return child.wait()


sweep_cli.run = hang
from mlx_medic.cli import main

sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Scene:
    """The clean cluster, the tiny model, and where the test's engines go."""

    cluster: Cluster
    tiny_model: Path
    tmp_path: Path
    ssh_transports: list[SshTransport]
    engines: list[Engine]

    async def engine(self, served: Served) -> Engine:
        """The remediator's engine in this process over real SSH, started."""
        _, engine = await start_engine(served, self.tmp_path, self.ssh_transports, self.engines)
        return engine


@pytest.fixture
def scene(
    clean_cluster: Cluster,
    tiny_model: Path,
    tmp_path: Path,
    ssh_transports: list[SshTransport],
    engines: list[Engine],
) -> Scene:
    return Scene(clean_cluster, tiny_model, tmp_path, ssh_transports, engines)


@contextmanager
def stopped_service(cluster: Cluster, tiny_model: Path, body: str) -> Iterator[Served]:
    """The tiny model's supervisord program, stopped (the model is down), under supervisord
    in the head's namespaces; short timeouts; the peer's mlx-medic the PEER_MEDIC script
    with `body` (STARTED and GO in the scenario's dir)."""
    served = prepare(cluster, tiny_model)
    work = served.inventory.parent
    medic = checkout_medic(work)
    hung_sweep = work / "hung-sweep.py"
    hung_sweep.write_text(HUNG_SWEEP.format(child=str(work / "sweep-child")))
    peer_medic = work / "peer-mlx-medic"
    peer_medic.write_text(
        PEER_MEDIC.format(
            started=work / "sweep-started",
            body=body.format(go=work / "go", python=sys.executable, hung_sweep=hung_sweep),
            medic=medic,
            checkout=CHECKOUT,
        )
    )
    peer_medic.chmod(0o755)
    data = yaml.safe_load(served.inventory.read_text())
    data["ssh"]["command_timeout"] = f"{COMMAND_TIMEOUT:g}s"
    data["ssh"]["helper_sessions"] = False  # a process per call: the peer's script sees each
    for node in data["nodes"].values():
        node["medic_command"] = str(medic)
    data["nodes"]["ai002"]["medic_command"] = str(peer_medic)
    data["models"]["tiny"]["policy"].update(
        start_timeout="20s", kill_grace=f"{KILL_GRACE:g}s", restart_budget=3, backoff=0
    )
    served.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    # a start would show as RUNNING
    daemon = start_supervisord(served, "/bin/sleep 600\nautostart=false", stopwaitsecs=5)
    try:
        wait_until(lambda: program_state(served) == "STOPPED", "supervisord to answer")
        yield served
    finally:
        served.supervisorctl("stop", f"tiny-{served.token}")
        daemon.kill()
        daemon.wait(timeout=10)


def program_state(served: Served) -> str:
    status = served.supervisorctl("status", f"tiny-{served.token}").stdout.split()
    return status[1] if len(status) > 1 else ""


def sweep_started(served: Served, written: str = "sweep-started") -> int | None:
    """The peer's sweep helper (its host pid), once it has started; `written`: the file
    with the node's pid (the hung helper's child: "sweep-child")."""
    started = served.inventory.parent / written
    if not started.exists() or not started.read_text().strip():
        return None
    return served.cluster.node("ai002").host_pid_of(int(started.read_text()))


async def submit_down(engine: Engine) -> float:
    """A model-down alert's run, started: when (time.monotonic)."""
    started = time.monotonic()
    assert await engine.submit(alert(uuid.uuid4().hex[:16], "tiny")) == Disposition.STARTED
    return started


async def run_ended(engine: Engine, started: float) -> tuple[RunView, float]:
    """The run, once ended, and its seconds since `started`."""
    await engine.wait_idle(300)
    return engine.journal.list_runs()[0], time.monotonic() - started


def assert_escalated_at_the_peers_sweep(run: RunView, served: Served) -> None:
    steps = [(step.name, step.node, step.outcome) for step in run.steps]
    assert run.outcome == "escalated", (run.detail, steps)
    assert [name for name, _, _ in steps] == ["preflight", "stop-service", "sweep"], steps
    assert steps[-1][2] == "failed", steps
    limit = f"{COMMAND_TIMEOUT + KILL_GRACE:g}s"
    silent = f"ai002 timed out in the sweep: ai002: mlx-medic node sweep: no answer within {limit}"
    assert run.steps[-1].detail.startswith(silent) and silent in run.detail, run.detail
    assert run.next_action is not None
    assert f"`mlx-medic node sweep` on ai002 gave no answer within {limit}" in run.next_action
    assert program_state(served) == "STOPPED"  # nothing started on top of possible orphans


async def test_a_hung_sweep_helper_ends_its_call_at_its_timeout_and_itself_on_the_node(
    scene: Scene,
) -> None:
    hung: list[int] = []
    with stopped_service(scene.cluster, scene.tiny_model, HANGS) as served:
        try:
            engine = await scene.engine(served)
            started = await submit_down(engine)
            await wait_for_sweep(served, engine, written="sweep-child")
            seen = time.monotonic()  # the helper started before: its limit ends by then + it
            hung = [pid for file in WRITTEN if (pid := sweep_started(served, file))]
            assert len(hung) == 2, hung  # the helper and its child, hanging
            run, took = await run_ended(engine, started)
            # The helper's own timeout (command_timeout + kill_grace) ends the call, long
            # before the step's (the longer of start_timeout and command_timeout, + 60 s).
            assert took < COMMAND_TIMEOUT + KILL_GRACE + 20, took
            assert_escalated_at_the_peers_sweep(run, served)
            # The call's end does not end the helper on the node (sshd signals no command
            # without a terminal): the helper, sent the same limit, ends itself and its
            # child once it passed, with nobody signalling it (3 s: the kill and the reaping).
            limit = COMMAND_TIMEOUT + KILL_GRACE
            assert processes.wait_gone(hung, timeout=seen + limit + 3 - time.monotonic()) == []
        finally:
            for pid in hung:
                processes.kill_quietly(pid)


WRITTEN = ("sweep-started", "sweep-child")  # the hung helper's pid, its child's


async def test_a_node_lost_during_its_sweep_ends_the_run_within_its_timeouts(
    scene: Scene,
) -> None:
    peer = scene.cluster.node("ai002")
    with stopped_service(scene.cluster, scene.tiny_model, WAITS_FOR_GO) as served:
        engine = await scene.engine(served)
        started = await submit_down(engine)
        await wait_for_sweep(served, engine)
        # Every sshd process of the peer frozen, the session running its sweep too; then
        # the sweep goes on, its answer held by the frozen sshd.
        with frozen(peer.find_pids("sshd"), f"sshd-{served.token}"):
            (served.inventory.parent / "go").touch()
            run, took = await run_ended(engine, started)
            assert took < COMMAND_TIMEOUT + KILL_GRACE + 20, took
            assert_escalated_at_the_peers_sweep(run, served)


async def wait_for_sweep(
    served: Served, engine: Engine, timeout: float = 60, written: str = "sweep-started"
) -> None:
    """Until the peer's sweep helper has started (the run is in its sweep step) and
    written its pid to `written`."""
    deadline = time.monotonic() + timeout
    while sweep_started(served, written) is None:
        assert time.monotonic() < deadline, engine.journal.list_runs()[0]
        await asyncio.sleep(0.1)
