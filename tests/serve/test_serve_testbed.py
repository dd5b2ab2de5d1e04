"""`mlx-medic serve` for real: the tiny model on real mlx_lm.server over real mlx.launch,
across the testbed's ai001 (head) and ai002, with supervisord inside the head's
namespaces as KeepAlive. JACCL is unavailable on Linux for real (`mlx.launch --backend
jaccl` fails), so every start shows the fallback to ring with `--pipeline`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlx_medic.serve.record import ServeRecord
from mlx_medic.state.ledger import read_ledger, record_spend
from mlx_medic.state.node_identity import read_node_id
from mlx_medic.state.runs import read_current_run, read_lease
from testbed import Cluster, processes
from testbed.launch import rank_pids, start_launch
from tests.serve.scenario import (
    MEDIC,
    Served,
    answers,
    jaccl_failure_logged,
    prepare,
    supervised,
    wait_until,
)
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

# After a SIGKILLed wrapper, the guards end the run once its lease (10s here) runs out and
# the rank has had its grace (3s): "a few seconds", with room for a busy machine.
ORPHAN_LIMIT = 40.0


@pytest.fixture
def served(clean_cluster: Cluster, tiny_model: Path):
    scenario = prepare(clean_cluster, tiny_model)
    yield scenario
    scenario.close()


def head_metrics(served: Served) -> dict[tuple, float]:
    popen = served.head.spawn(
        [MEDIC, "exporter", "--once", "--inventory", str(served.inventory), "--node", "ai001"],
        env=served.cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert popen.returncode == 0, err.decode()
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(out.decode())
        for s in family.samples
    }


def metric(samples: dict[tuple, float], name: str, **labels: str) -> float | None:
    key = (name, *sorted({"node": "ai001", **labels}.items()))
    return samples.get(key)


def guard_log(state_dir: Path) -> str:
    try:
        return (state_dir / "runs" / "tiny.guard.log").read_text()[-4000:]
    except OSError as exc:
        return f"(unreadable: {exc})"


def second_serve_is_refused(served: Served) -> None:
    second = served.run_direct(timeout=120)
    assert second.returncode == 3, second.stderr
    assert "already being started or served" in second.stderr
    assert f"supervisorctl -c {served.conf} restart tiny-{served.token}" in second.stderr


def test_supervisord_serves_on_ring_after_jaccl_fails_and_a_restart_leaves_no_old_rank(
    served: Served,
):
    require_tool("supervisord")
    with supervised(served):
        first = served.wait_serving()
        assert first.backend == "ring"
        output = served.output()
        assert jaccl_failure_logged(output), output[-3000:]
        assert "falling back to the ring backend with --pipeline" in output
        old = {node: served.ranks(node, first.run_id) for node in ("ai001", "ai002")}
        assert all(len(pids) == 1 for pids in old.values()), old
        for pids in old.values():
            assert "--pipeline" in processes.cmdline(pids[0])

        samples = head_metrics(served)
        assert metric(samples, "mlx_serve_backend", model="tiny", backend="ring") == 1
        assert metric(samples, "mlx_serve_backend", model="tiny", backend="jaccl") == 0
        assert metric(samples, "mlx_serve_state", model="tiny", state="serving") == 1

        # A second wrapper while the first serves: refused at once, the ranks untouched.
        second_serve_is_refused(served)
        assert all(processes.is_alive(pid) for pids in old.values() for pid in pids)
        assert answers(served.port)

        # A proper restart: the old wrapper ends its run everywhere, the new one serves.
        restart = served.supervisorctl("restart", f"tiny-{served.token}")
        assert restart.returncode == 0, restart.stdout + restart.stderr
        second = served.wait_serving(run_id=first.run_id)
        assert second.run_id != first.run_id
        assert [pid for pids in old.values() for pid in pids if processes.is_alive(pid)] == []
        assert served.ranks("ai001", first.run_id) == served.ranks("ai002", first.run_id) == []
        assert len(served.ranks("ai002", second.run_id)) == 1
        assert answers(served.port)


RANK_SCRIPT = """\
import time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
mx.eval(mx.distributed.all_sum(mx.ones(1)))
print(f"rank {group.rank()} ready", flush=True)
time.sleep(3600)
"""


@pytest.mark.least_privilege
def test_a_sigkilled_wrapper_leaves_no_rank_anywhere_while_a_sigkilled_mlx_launch_does(
    served: Served,
):
    cluster = served.cluster
    popen, wrapper = served.start_direct()
    # A second wrapper while the first starts (its ranks loading): refused, nothing touched.
    wait_until(
        lambda: (
            (r := served.record()) is not None and r.backend == "ring" and served.ranks("ai002")
        ),
        300,
        "the first wrapper launching its ranks",
    )
    loading = served.ranks("ai001") + served.ranks("ai002")
    starting = served.record()
    assert starting is not None and starting.state == "starting"
    # The lock is held until the ranks are up; the run is current, with a lease, everywhere.
    lock = json.loads((served.head.state_dir / "locks" / "tiny.lock").read_text())
    assert (lock["holder"], lock["run_id"]) == ("serve", starting.run_id)
    for node in ("ai001", "ai002"):
        state_dir = cluster.node(node).state_dir
        assert read_current_run(state_dir, "tiny") == starting.run_id
        lease = read_lease(state_dir, "tiny")
        assert lease is not None and lease.run_id == starting.run_id
    second_serve_is_refused(served)
    assert all(processes.is_alive(pid) for pid in loading)
    record = served.wait_serving()
    assert record.run_id == starting.run_id
    assert not (served.head.state_dir / "locks" / "tiny.lock").exists()  # released once up
    ranks = served.ranks("ai001", record.run_id) + served.ranks("ai002", record.run_id)
    assert sorted(ranks) == sorted(loading)
    assert served.launchers()

    os.kill(wrapper, signal.SIGKILL)  # no teardown: only the guards are left to act
    popen.wait(timeout=30)

    def run_gone() -> bool:
        return not (
            served.ranks("ai001", record.run_id)
            or served.ranks("ai002", record.run_id)
            or served.launchers()
        )

    def what_is_left() -> str:
        left = [
            f"{node} pid {pid} ({processes.state(pid)}): {' '.join(processes.cmdline(pid))}"
            for node in ("ai001", "ai002")
            for pid in served.ranks(node, record.run_id)
        ]
        left += [f"ai001 mlx.launch pid {pid}" for pid in served.launchers()]
        logs = [
            f"{node} guard log:\n{guard_log(cluster.node(node).state_dir)}"
            for node in ("ai001", "ai002")
        ]
        return "\n".join(left + logs)

    took = wait_until(
        run_gone, ORPHAN_LIMIT, "no rank of the killed run and no mlx.launch", what_is_left
    )
    print(f"after SIGKILL of the wrapper, its run was gone from every node in {took:.1f}s")

    # The same crash without the wrapper: plain mlx.launch, SIGKILLed, leaves the peer's rank.
    script = served.inventory.parent / "plain_rank.py"
    script.write_text(RANK_SCRIPT)
    plain = start_launch(
        cluster,
        served.ring_hostfile,
        [cluster.python, str(script)],
        launch_args=["--starting-port", str(served.port % 1000 + 53000)],
    )
    try:
        plain.wait_for_output("rank 1 ready", timeout=120)
        plain.kill()
        time.sleep(took + 5)  # longer than the wrapper's run took to go
        assert len(rank_pids(cluster.node("ai002"), str(script))) == 1
    finally:
        plain.close()


def test_a_dead_launchs_broken_listener_is_swept_and_a_node_at_its_reserve_gets_no_jaccl(
    served: Served,
):
    cluster = served.cluster
    peer = cluster.node("ai002")
    assert read_node_id(peer.state_dir) == "ai002"
    for pid in range(1, 6):  # the default reserve: 5 domains spent this boot, devices unknown
        record_spend(
            peer.state_dir, "ai002", "sigkill", pid=pid, start_time=1.0, boot_id=peer.boot_id
        )

    earlier = start_earlier_run(served)
    try:
        left = rank_pids(cluster.node("ai001"), "mlx_lm") + rank_pids(peer, "mlx_lm")
        assert len(left) == 2
        earlier.kill()  # mlx.launch SIGKILLed alone: its peer session goes, rank 0 listens on
        assert listening(served.port)

        popen, _ = served.start_direct()
        record = served.wait_serving()
        assert [pid for pid in left if processes.is_alive(pid)] == []
        assert record.backend == "ring"
        output = served.output()
        # Broken, not busy: refused at once each time, so a short window.
        assert (
            f"listens on model tiny's port {served.port} and does not answer (3 probes" in output
        ), output[-3000:]
        assert (
            "no JACCL start: jaccl failed on ai002: the protection-domain ledger is at the"
            " reserve on rdma_ai001: 5 spent (reserve 5 per device" in output
        ), output[-3000:]
        assert "(models placed on ai002: tiny)" in output
        assert "smoke test: jaccl" not in output
        assert "ring smoke test skipped: ring is the last backend to try" in output
        assert "falling back to the ring backend with --pipeline" in output

        # A rank fails while serving (mlx.launch itself would exit 0): the wrapper ends
        # every rank of its run, says which node failed, and with no relaunch left exits 1.
        (peer_rank,) = served.ranks("ai002", record.run_id)
        os.kill(peer_rank, signal.SIGKILL)
        assert popen.wait(timeout=120) == 1
        assert served.ranks("ai001") == served.ranks("ai002") == [] and not served.launchers()
        failed = served.record()
        assert failed is not None and failed.state == "failed"
        assert [(f.backend, f.host) for f in failed.failures] == [("ring", "ai002")]
        assert "ring failed on ai002: a rank ended" in served.output()
    finally:
        earlier.close()


def test_an_answering_listener_on_the_port_is_never_touched_and_the_start_says_who_serves(
    served: Served,
):
    earlier = start_earlier_run(served)
    try:
        left = served.cluster.node("ai001").find_pids(f"--port {served.port}")
        result = served.run_direct(timeout=180)
        assert result.returncode == 3, result.stderr
        assert f"another instance serves model tiny on port {served.port}" in result.stderr
        assert "a serving process is never touched" in result.stderr
        assert left and all(processes.is_alive(pid) for pid in left)
        assert answers(served.port)
        assert not served.ranks(
            "ai002", (served.record() or ServeRecord("", 0, None, "failed")).run_id
        )
    finally:
        earlier.close()


def start_earlier_run(served: Served):
    """The model served by plain mlx.launch (an earlier deployment, a person by hand)."""
    cluster = served.cluster
    server = [
        cluster.python,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        str(served_model(served)),
        "--host",
        "127.0.0.1",
        "--port",
        str(served.port),
        "--pipeline",
    ]
    earlier = start_launch(
        cluster,
        served.ring_hostfile,
        server,
        env=cluster.env(HF_HUB_OFFLINE="1"),
        launch_args=["--starting-port", str(served.port % 1000 + 54000)],
    )
    try:
        wait_until(lambda: answers(served.port), 300, "the earlier run answering")
    except BaseException:
        earlier.close()
        raise
    return earlier


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def served_model(served: Served) -> str:
    import yaml

    return yaml.safe_load(served.inventory.read_text())["models"]["tiny"]["model"]


def test_with_the_ring_hostfile_broken_too_the_wrapper_exits_naming_each_failure(
    clean_cluster: Cluster,
    tiny_model: Path,
):
    broken = clean_cluster.workdir / f"broken-ring-{os.getpid()}-{time.time_ns()}.json"
    broken.write_text(
        '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "no-such-node'
        '.invalid", "ips": ["127.0.0.254"]}]\n'
    )
    served = prepare(clean_cluster, tiny_model, ring_hostfile=broken)
    try:
        result = served.run_direct()
        assert result.returncode == 1
        assert "the start failed: no backend started: jaccl failed on ai00" in result.stderr
        assert "; ring failed on ai00" in result.stderr, result.stderr
        record = served.record()
        assert record is not None and record.state == "failed"
        assert [f.backend for f in record.failures] == ["jaccl", "ring"]
        # Each JACCL rank that failed to start recorded it on its own node: disputed, no debt.
        spent = [
            e
            for node in ("ai001", "ai002")
            for e in read_ledger(
                clean_cluster.node(node).state_dir, node, clean_cluster.node(node).boot_id
            ).entries
        ]
        assert spent and {(e.kind, e.model) for e in spent} == {("failed_start", "tiny")}
        assert served.ranks("ai001") == served.ranks("ai002") == []
    finally:
        served.close()


def crash(served: Served, run_id: str) -> None:
    """The seed's crash: mlx.launch and the head's rank SIGKILLed together, no teardown."""
    (head_rank,) = served.ranks("ai001", run_id)
    for pid in (*served.launchers(), head_rank):
        os.kill(pid, signal.SIGKILL)


def test_after_a_crash_the_wrapper_relaunches_at_once_and_leaves_no_rank_of_the_crash(
    clean_cluster: Cluster,
    tiny_model: Path,
):
    served = prepare(
        clean_cluster, tiny_model, serve={"relaunch_limit": 2, "relaunch_interval": "1s"}
    )
    try:
        popen, wrapper = served.start_direct()
        first = served.wait_serving()
        crash(served, first.run_id)
        second = served.wait_serving(run_id=first.run_id)
        record = served.record()
        assert record is not None and record.pid == served.head.ns_pid_of(wrapper)  # the same
        assert popen.poll() is None
        assert served.ranks("ai001", first.run_id) == served.ranks("ai002", first.run_id) == []
        output = served.output()
        assert "relaunching at once (1 of 2 within 600s)" in output
        assert "phase start sweep and run record" in output
        # the crashed run's ranks went in the start sweep, before any wait for the interval
        assert output.index(
            "phase start sweep and run record", output.index("relaunching")
        ) < output.index("launching on", output.index("relaunching"))

        # A crash loop spends the budget, then the wrapper exits for the service manager.
        crash(served, second.run_id)
        third = served.wait_serving(run_id=second.run_id)
        crash(served, third.run_id)
        assert popen.wait(timeout=120) == 1
        assert "2 relaunches within 600s spent (serve.relaunch_limit)" in served.output()
        assert served.ranks("ai001") == served.ranks("ai002") == [] and not served.launchers()
    finally:
        served.close()
