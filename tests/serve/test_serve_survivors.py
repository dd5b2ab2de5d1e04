"""`mlx-medic serve` through the seed's `Us+` survivors, on the testbed's simulated JACCL
(finite pools of protection domains per device; an orphaned JACCL rank hangs, then
freezes in state D until its node "reboots"): real sshd nodes, real mlx.launch, the tiny
model on real mlx_lm.server, supervisord as KeepAlive.

A survivor is made as the seed made it: a real mlx.launch of the model (no mlx-medic),
crashed (mlx.launch and the head's rank SIGKILLed together), its peer rank left until it
froze. Being unkillable never by itself holds the model down: the start goes on, on
JACCL while the ledger leaves every device it needs below the reserve, else on ring with
--pipeline; only a survivor holding the model's port stops it.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlx_medic.serve.record import ServeRecord
from mlx_medic.state.backend_choice import read_backend_choice, write_backend_choice
from mlx_medic.state.ledger import device_debt, read_ledger
from testbed import Cluster, processes
from testbed.faults import frozen_survivor, seed_crash
from testbed.freezer import frozen
from testbed.jaccl_sim import JacclSim, start_jaccl_sim
from tests.serve.scenario import MEDIC, Served, answers, prepare, supervised, wait_until
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

POLICY = {"kill_grace": "3s", "stop_timeout": "40s", "start_timeout": "5m"}


@pytest.fixture
def sim(clean_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[JacclSim]:
    mode = getattr(request, "param", "release")
    simulated = start_jaccl_sim(clean_cluster, on_sigkill=mode, capacity=3, killable_for=3.0)
    try:
        yield simulated
    finally:
        simulated.close()


def on_sim(
    cluster: Cluster, tiny_model: Path, sim: JacclSim, reserve: int, **serve: object
) -> Served:
    return prepare(
        cluster,
        tiny_model,
        serve={**sim.serve_settings(), **serve},
        extra_model={"policy": {**POLICY, "pd_reserve": reserve}},
    )


def survivor_on_peer(served: Served, sim: JacclSim) -> int:
    """The seed's frozen rank on ai002, of a crashed run of this model; its host pid."""
    return frozen_survivor(
        served.cluster,
        sim,
        model=model_dir(served),
        port=served.port,
        hostfile=served.jaccl_hostfile,
        starting_port=random.randrange(53000, 60000, 20),
        log=served.inventory.parent / "earlier.log",
    )


def model_dir(served: Served) -> Path:
    import yaml

    return Path(yaml.safe_load(served.inventory.read_text())["models"]["tiny"]["model"])


def ledger_units(served: Served, node: str) -> dict[str, int]:
    simnode = served.cluster.node(node)
    return read_ledger(simnode.state_dir, node, simnode.boot_id).debt_by_unit()


def serving_backend(record: ServeRecord | None) -> str | None:
    return None if record is None else record.backend


def test_with_a_frozen_survivor_on_the_peer_the_model_starts_on_jaccl_while_the_ledger_allows(
    clean_cluster: Cluster,
    tiny_model: Path,
    sim: JacclSim,
):
    require_tool("supervisord")
    served = on_sim(clean_cluster, tiny_model, sim, reserve=3)
    try:
        stuck = survivor_on_peer(served, sim)
        with supervised(served):
            record = served.wait_serving()
            assert serving_backend(record) == "jaccl"
            assert answers(served.port)
            assert processes.state(stuck) == "D"  # still there, still frozen
            output = served.output()
            assert "survives SIGKILL" in output and "the start goes on around it" in output
            assert "reboot ai002 to free 1 protection domain(s)" in output
            # The survivor is in ai002's ledger once, on its device; the pool holds it and
            # the new rank.
            peer = clean_cluster.node("ai002")
            survivors = read_ledger(peer.state_dir, "ai002", peer.boot_id).survivors
            assert [(e.pid, e.devices) for e in survivors] == [
                (peer.ns_pid_of(stuck), ("rdma_ai001",))
            ]
            assert device_debt(ledger_units(served, "ai002"), "rdma_ai001") == 1
            assert sim.usage("ai002")["rdma_ai001"] == 2
            assert "jaccl: the protection-domain ledger leaves room" in record.backend_reason
    finally:
        served.close()


def test_with_the_reserve_reached_the_model_starts_on_ring_with_pipeline_and_answers(
    clean_cluster: Cluster,
    tiny_model: Path,
    sim: JacclSim,
):
    require_tool("supervisord")
    served = on_sim(clean_cluster, tiny_model, sim, reserve=1)
    try:
        survivor_on_peer(served, sim)
        with supervised(served):
            record = served.wait_serving()
            assert serving_backend(record) == "ring"
            assert "--pipeline" in record.argv and "ring" in record.argv
            for node in ("ai001", "ai002"):
                (rank,) = served.ranks(node, record.run_id)
                assert "--pipeline" in processes.cmdline(rank)
            output = served.output()
            assert (
                "no JACCL start: jaccl failed on ai002: the protection-domain ledger is at"
                " the reserve on rdma_ai001: 1 spent (reserve 1 per device"
            ) in output
            assert "falling back to the ring backend with --pipeline" in output
            assert sim.usage("ai002")["rdma_ai001"] == 1  # the survivor's alone
            assert answers(served.port)
    finally:
        served.close()


@pytest.mark.parametrize("sim", ["release", "keep"], indirect=True)
def test_over_five_crashes_beside_a_survivor_the_pool_stops_growing_and_the_ledger_agrees(
    clean_cluster: Cluster,
    tiny_model: Path,
    sim: JacclSim,
):
    require_tool("supervisord")
    served = on_sim(
        clean_cluster, tiny_model, sim, reserve=3, relaunch_limit=3, relaunch_interval="1s"
    )
    try:
        stuck = survivor_on_peer(served, sim)
        peer = clean_cluster.node("ai002")
        stuck_ns = peer.ns_pid_of(stuck)
        time.sleep(1.0)
        # What the pool held before mlx-medic ran, which no ledger can know: in keep mode the
        # earlier run's SIGKILLed head rank (the survivor itself is counted once swept).
        before = {n: sim.usage(n) for n in ("ai001", "ai002")}
        before["ai002"]["rdma_ai001"] -= 1  # the survivor's, on its device
        in_use: list[dict[str, dict[str, int]]] = []
        with supervised(served):
            record = served.wait_serving()
            for _ in range(5):
                seed_crash(clean_cluster, served.port)
                record = served.wait_serving(run_id=record.run_id)
                time.sleep(1.0)  # a killed holder's domain frees once its last thread went
                in_use.append({n: sim.usage(n) for n in ("ai001", "ai002")})
                for node in ("ai001", "ai002"):
                    ledger_agrees_with_pool(
                        served,
                        sim,
                        node,
                        before[node],
                        stuck_ns if node == "ai002" else None,
                        exact=sim.on_sigkill == "keep",
                    )
            backends = served.output().count("serving tiny on ring")
        # The pool stops growing: the last three recoveries hold what the third did.
        assert in_use[2] == in_use[3] == in_use[4], in_use
        assert all(n <= 3 for pools in in_use for usage in pools.values() for n in usage.values())
        assert backends >= 3  # JACCL while the ledger allowed, then ring
        assert processes.state(stuck) == "D"
        assert not [o for o in sim.orphans() if o.host_pid is not None and o.host_pid != stuck]
    finally:
        served.close()


def ledger_agrees_with_pool(
    served: Served,
    sim: JacclSim,
    node: str,
    before: dict[str, int],
    survivor: int | None,
    exact: bool,
) -> None:
    """The pool's domains that no live rank of the current run holds (less what it held
    before mlx-medic ran) are what the ledger counts: exactly where a SIGKILLed holder
    keeps them (keep), at least where a dead holder gives them back (release: the ledger
    cannot see that and counts the spend)."""
    record = served.record()
    assert record is not None
    current = {
        served.cluster.node(node).ns_pid_of(pid) for pid in served.ranks(node, record.run_id)
    }
    units = ledger_units(served, node)
    for device in sim.devices(node):
        held_by_current = sum(
            1 for h in sim.holders(node) if h.device == device and h.alive and h.pid in current
        )
        spent = sim.in_use(node, device) - held_by_current - before.get(device, 0)
        counted = device_debt(units, device)
        assert counted == spent if exact else counted >= spent, (node, device, units)
    if survivor is not None:
        assert survivor in {h.pid for h in sim.holders(node) if h.alive}


def test_a_survivor_holding_the_models_port_stops_the_start_with_the_reboot_it_needs(
    clean_cluster: Cluster,
    tiny_model: Path,
    sim: JacclSim,
):
    served = on_sim(clean_cluster, tiny_model, sim, reserve=3)
    head = clean_cluster.node("ai001")
    squatter = head.spawn(
        [
            clean_cluster.python,
            "-c",
            LISTENER,
            "--port",
            str(served.port),
            "--model",
            str(model_dir(served)),
        ],
        env=clean_cluster.env(MLX_RANK="0", MLX_MEDIC_MODEL="tiny"),
    )
    pid = head.spawned_pid(squatter)
    try:
        wait_until(lambda: listening_pid(head, served.port), 30, "the squatter listening")
        with frozen([pid], served.token):
            result = served.run_direct(timeout=240)
            assert result.returncode == 1, result.stderr
            assert "survives SIGKILL holds model tiny's port" in result.stderr
            assert "Reboot ai001" in result.stderr
            record = served.record()
            assert record is not None and record.reboot == ("ai001",)
            assert record.failures[0].host == "ai001" and not served.launchers()
            needed = [
                (s.labels, s.value)
                for family in text_string_to_metric_families(head_scrape(served))
                for s in family.samples
                if s.name == "mlx_serve_reboot_needed"
            ]
            assert needed == [({"model": "tiny", "reboot_node": "ai001", "node": "ai001"}, 1.0)]
    finally:
        squatter.kill()
        squatter.wait(timeout=10)


LISTENER = """\
import socket, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
server = socket.socket()
server.bind(("127.0.0.1", port))
server.listen()
time.sleep(3600)
"""


def listening_pid(head, port: int) -> bool:
    return head.run(f"ss -ltn 'sport = :{port}' | grep -q LISTEN", check=False).returncode == 0


def head_scrape(served: Served) -> str:
    popen = served.head.spawn(
        [MEDIC, "exporter", "--once", "--inventory", str(served.inventory), "--node", "ai001"],
        env=served.cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert popen.returncode == 0, err.decode()
    return out.decode()


def test_after_the_reboot_an_mlx_medic_ring_pin_is_lifted_once_and_a_persons_pin_stays(
    clean_cluster: Cluster,
    tiny_model: Path,
    sim: JacclSim,
):
    served = on_sim(clean_cluster, tiny_model, sim, reserve=3)
    state = served.head.state_dir
    try:
        survivor_on_peer(served, sim)
        write_backend_choice(
            state,
            "tiny",
            "ring",
            by="remediator run 7",
            reason="jaccl failed on ai002: Couldn't allocate",
        )
        assert serve_once(served) == "ring"  # pinned: the boot ids are stamped with it
        stamped = read_backend_choice(state, "tiny")
        assert stamped.boots == {n: clean_cluster.node(n).boot_id for n in ("ai001", "ai002")}

        for node in ("ai001", "ai002"):  # the survivor thawed (it dies), pools cleared
            clean_cluster.reboot(node)
        assert sim.in_use("ai002") == 0
        assert serve_once(served) == "jaccl"  # by itself, after its smoke test
        output = served.output()
        assert "ring pin lifted: ai001, ai002 rebooted since remediator run 7 pinned ring" in output
        assert "smoke test jaccl: ok" in output
        lifted = read_backend_choice(state, "tiny")
        assert (lifted.choice, lifted.by) == ("auto", "mlx-medic serve")

        write_backend_choice(
            state,
            "tiny",
            "ring",
            by="ana@ops1 at a terminal",
            reason="cable work",
            boots={"ai001": "old", "ai002": "old"},
        )
        clean_cluster.reboot("ai002")
        assert serve_once(served) == "ring"  # a person's pin stays, whatever rebooted
        assert read_backend_choice(state, "tiny").by == "ana@ops1 at a terminal"
    finally:
        served.close()


def serve_once(served: Served) -> str | None:
    """One wrapper, until it serves; then SIGTERM (every rank ends) and its backend."""
    popen, wrapper = served.start_direct()
    try:
        record = served.wait_serving(
            run_id=(served.record() or ServeRecord("", 0, None, "stopped")).run_id
        )
    finally:
        processes.kill_quietly(wrapper, signal.SIGTERM)
        popen.wait(timeout=60)
    assert served.ranks("ai001", record.run_id) == served.ranks("ai002", record.run_id) == []
    return record.backend
