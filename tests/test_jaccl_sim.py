"""The testbed's simulated JACCL backend (testbed/README.md, "Simulated JACCL").

Real `mlx.launch --backend jaccl` inside the head, real ssh to the peers, the real ring
backend and mlx_lm.server; only JACCL itself is simulated, by the interpreter shim
`sim.python`: finite protection-domain pools per device, JACCL's allocation error, and
ranks that hang as orphans instead of exiting.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import Cluster, free_port, processes, wait_listening
from testbed.jaccl_sim import JacclSim, start_jaccl_sim
from testbed.launch import LaunchHandle, rank_pids, start_launch
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ALLOCATION_ERROR = "RuntimeError: [jaccl] Couldn't allocate protection domain"

# Initialises JACCL as the product's smoke test does, all-reduces, says so, and holds its
# domains until the file argv[1] exists; argv[2] says how it then ends.
HOLD = """\
import os, signal, sys, time
from pathlib import Path
import mlx.core as mx
group = mx.distributed.init(backend="jaccl", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
print(f"rank {group.rank()} of {group.size()} sum {total.item():g}", flush=True)
release = Path(sys.argv[1])
while not release.exists():
    time.sleep(0.05)
how = sys.argv[2] if len(sys.argv) > 2 else "normally"
if how == "by-exception":
    raise ValueError("the rank program failed")
if how == "by-sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
"""

# All-reduces in a loop, as mlx_lm.server's generation thread keeps its ranks in step.
LOOP = """\
import time
import mlx.core as mx
group = mx.distributed.init(backend="jaccl", strict=True)
print(f"rank {group.rank()} looping", flush=True)
while True:
    mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group))
    time.sleep(0.02)
"""

# What a ring rank sees: the group from a plain init(), the sum, and whose init it was.
RING = """\
import sys
import mlx.core as mx
group = mx.distributed.init()
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
simulated = "mlx_medic_testbed_jaccl_rank" in sys.modules
print(f"rank {group.rank()} of {group.size()} sum {total.item():g}"
      f" init from {mx.distributed.init.__module__} simulated={simulated}", flush=True)
"""

_ports = itertools.count(random.randrange(41000, 58000, 100), 10)


@pytest.fixture
def make_sim(clean_cluster: Cluster) -> Iterator[Callable[..., JacclSim]]:
    """Simulators on the session cluster, closed (groups thawed, removed) after the test."""
    require_tool("nsenter")
    made: list[JacclSim] = []

    def make(**settings: Any) -> JacclSim:
        sim = start_jaccl_sim(clean_cluster, **settings)
        made.append(sim)
        return sim

    yield make
    for sim in made:
        sim.close()


@pytest.fixture
def programs(clean_cluster: Cluster) -> dict[str, Path]:
    """The rank programs, where every node reads them (the workdir, not /tmp)."""
    paths = {}
    for name, text in (("hold", HOLD), ("loop", LOOP), ("ring", RING)):
        paths[name] = clean_cluster.workdir / f"jaccl-sim-{name}.py"
        paths[name].write_text(text)
    return paths


def launch_jaccl(
    cluster: Cluster,
    sim: JacclSim,
    nodes: list[str],
    argv: list[str],
    env: dict[str, str] | None = None,
) -> LaunchHandle:
    """`mlx.launch --backend jaccl --python <shim>` in nodes[0], as the product starts JACCL."""
    hostfile = cluster.hostfile(
        cluster.workdir / f"jaccl-{uuid.uuid4().hex[:8]}.json", nodes, backend="jaccl"
    )
    launch_args = ["--python", str(sim.python), "--starting-port", str(next(_ports))]
    return start_launch(
        cluster, hostfile, argv, env=env, head=nodes[0], backend="jaccl", launch_args=launch_args
    )


def release_file(cluster: Cluster) -> Path:
    return cluster.workdir / f"release-{uuid.uuid4().hex[:8]}"


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def settles(read: Callable[[], object], expected: object, timeout: float = 5.0) -> None:
    """`read()` comes to `expected`: a dead holder's domain is free once its last thread
    has exited, a moment after its main thread shows as a zombie."""
    deadline = time.monotonic() + timeout
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value == expected


def in_use(sim: JacclSim, *nodes: str) -> Callable[[], list[int]]:
    return lambda: [sim.in_use(node) for node in nodes]


def output_lines(run: LaunchHandle) -> list[str]:
    return [line.strip() for line in run.output().replace("\r", "").splitlines()]


# --- 1. a rank on the shim ---------------------------------------------------------------


@pytest.mark.parametrize("on_sigkill", ["release", "keep"])
def test_a_jaccl_rank_gets_the_sum_and_holds_one_domain_per_device_until_it_exits(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
    on_sigkill: str,
) -> None:
    sim = make_sim(on_sigkill=on_sigkill)
    release = release_file(clean_cluster)
    with launch_jaccl(
        clean_cluster, sim, ["ai001", "ai002"], [str(programs["hold"]), str(release)]
    ) as run:
        run.wait_for_output("rank 0 of 2 sum 3")
        run.wait_for_output("rank 1 of 2 sum 3")
        assert sim.usage("ai001") == {"rdma_ai002": 1, "rdma_ai003": 0}
        assert sim.usage("ai002") == {"rdma_ai001": 1, "rdma_ai003": 0}
        [holder] = sim.holders("ai002")
        assert holder.alive and holder.rank == 1
        assert holder.host_pid in rank_pids(clean_cluster.node("ai002"), str(programs["hold"]))

        release.touch()
        assert run.wait(timeout=30) == 0, run.output()
    settles(in_use(sim, "ai001", "ai002"), [0, 0])
    assert sim.orphans() == []


def test_the_products_smoke_test_passes_on_the_shim_and_no_rank_is_judged_an_orphan(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
) -> None:
    """Its ranks all exit normally right after one all_sum: none may stay behind."""
    sim = make_sim(on_sigkill="keep")
    state = clean_cluster.head.state_mount
    smoke = [
        "-m",
        "mlx_medic.serve.smoke",
        "--backend",
        "jaccl",
        "--state-dir",
        str(state),
        "--model",
        "tiny",
    ]
    with launch_jaccl(clean_cluster, sim, ["ai001", "ai002"], smoke) as run:
        assert run.wait(timeout=60) == 0, run.output()
    lines = output_lines(run)
    assert "mlx-medic smoke: rank 0 of 2 ok sum=2" in lines, lines
    assert "mlx-medic smoke: rank 1 of 2 ok sum=2" in lines, lines
    assert sim.orphans() == []
    settles(in_use(sim, "ai001", "ai002"), [0, 0])


# --- 2. a full pool ----------------------------------------------------------------------


def test_a_full_device_fails_the_start_with_jaccls_error_and_gives_back_the_other_devices(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
) -> None:
    # ai002's device towards ai003 has one domain; a rank of another launch holds it. Keep
    # mode: what comes back below comes back by the ranks' own orderly exits.
    sim = make_sim(on_sigkill="keep", capacities={"ai002": {"rdma_ai003": 1}})
    hold = [str(programs["hold"]), str(release_file(clean_cluster))]
    with launch_jaccl(clean_cluster, sim, ["ai002", "ai003"], hold) as holding:
        holding.wait_for_output("rank 0 of 2 sum 3")
        assert sim.usage("ai002") == {"rdma_ai001": 0, "rdma_ai003": 1}

        # ai002's rank of a mesh over all three takes rdma_ai001, then finds rdma_ai003 full.
        with launch_jaccl(clean_cluster, sim, ["ai001", "ai002", "ai003"], hold) as failing:
            failing.wait(timeout=60)
            assert ALLOCATION_ERROR in output_lines(failing), failing.output()
        assert (sim.pool("ai002", "rdma_ai001").path / "slot-0").exists()  # it was taken...
        assert sim.usage("ai002") == {"rdma_ai001": 0, "rdma_ai003": 1}  # ...and given back
        [holder] = sim.holders("ai002")
        assert holder.host_pid in rank_pids(clean_cluster.node("ai002"), str(programs["hold"]))
        # The launch's other ranks, ended by mlx.launch's teardown (SIGTERM, or SIGHUP as their
        # ssh session ends) while they waited for the failed one, gave theirs back too.
        settles(lambda: sim.usage("ai001"), {"rdma_ai002": 0, "rdma_ai003": 0})
        settles(lambda: sim.usage("ai003"), {"rdma_ai001": 0, "rdma_ai002": 1})  # holder's peer
        assert sim.orphans() == []


# --- 3. SIGKILL: mode (a) and mode (b); the reboot ----------------------------------------


@pytest.mark.parametrize("on_sigkill", ["release", "keep"])
def test_a_sigkilled_holders_domain_comes_back_in_release_mode_and_stays_in_keep_mode(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
    on_sigkill: str,
) -> None:
    sim = make_sim(on_sigkill=on_sigkill)
    peer = clean_cluster.node("ai002")
    hold = [str(programs["hold"]), str(release_file(clean_cluster))]
    with launch_jaccl(clean_cluster, sim, ["ai001", "ai002"], hold) as run:
        run.wait_for_output("rank 1 of 2 sum 3")
        [rank] = rank_pids(peer, str(programs["hold"]))
        os.kill(rank, signal.SIGKILL)
        assert processes.wait_gone([rank], 10) == []
        if on_sigkill == "release":
            settles(in_use(sim, "ai002"), [0])
            assert sim.holders("ai002") == []
            return
        settles(
            lambda: [(h.alive, h.host_pid, h.device) for h in sim.holders("ai002")],
            [(False, None, "rdma_ai001")],
        )  # dead, and still holding
        assert sim.in_use("ai002") == 1

    boot_id = peer.boot_id
    clean_cluster.reboot("ai002")
    settles(in_use(sim, "ai002"), [0])
    assert peer.boot_id != boot_id
    assert peer.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() == peer.boot_id


@pytest.mark.parametrize("how", ["normally", "by-exception", "by-sigterm"])
def test_in_keep_mode_a_normal_exit_an_uncaught_exception_and_sigterm_give_the_domains_back(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
    how: str,
) -> None:
    sim = make_sim(on_sigkill="keep")
    release = release_file(clean_cluster)
    with launch_jaccl(
        clean_cluster, sim, ["ai001", "ai002"], [str(programs["hold"]), str(release), how]
    ) as run:
        run.wait_for_output("rank 1 of 2 sum 3")
        assert sim.in_use("ai001") == sim.in_use("ai002") == 1
        release.touch()
        run.wait(timeout=30)
    settles(in_use(sim, "ai001", "ai002"), [0, 0])
    assert sim.orphans() == []  # an orderly end orphans nobody


# --- 4. the seed's crash: the peer's rank stays ---------------------------------------------


def complete(port: int, prompt: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"prompt": prompt, "max_tokens": 3}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)  # type: ignore[no-any-return]


def crash_launcher_and_head_rank(cluster: Cluster, run: LaunchHandle, needle: str) -> None:
    """SIGKILL mlx.launch and the head's rank together: no teardown reaches the peer."""
    [head_rank] = rank_pids(cluster.head, needle)
    os.kill(run.launcher_pid, signal.SIGKILL)
    os.kill(head_rank, signal.SIGKILL)
    assert processes.wait_gone([run.launcher_pid, head_rank], 10) == []


def test_after_the_seeds_crash_the_peers_server_rank_stays_deaf_to_sigterm_then_unkillable(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    tiny_model: Path,
) -> None:
    killable_for = 3.0
    sim = make_sim(killable_for=killable_for)
    peer = clean_cluster.node("ai002")
    port = free_port("127.0.0.1")
    server = [
        "-m",
        "mlx_lm",
        "server",
        "--model",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = clean_cluster.env(HF_HUB_OFFLINE="1")
    with launch_jaccl(clean_cluster, sim, ["ai001", "ai002"], server, env=env) as run:
        wait_listening("127.0.0.1", port, timeout=120)
        answer = complete(port, "The quick brown fox")  # served by both ranks, over the shim
        assert answer["object"] == "text_completion"
        [rank] = rank_pids(peer, str(tiny_model))
        assert sim.usage("ai002") == {"rdma_ai001": 1, "rdma_ai003": 0}

        crash_launcher_and_head_rank(clean_cluster, run, str(tiny_model))
        orphan = sim.wait_for_orphan("ai002")  # its generation thread died; it did not exit
        assert orphan.host_pid == rank
        assert processes.cmdline(processes.ppid(rank))[0].startswith("sshd: root@pts/")

        os.kill(rank, signal.SIGTERM)
        time.sleep(0.5)
        assert processes.is_alive(rank) and processes.state(rank) != "D"

        wait_until(lambda: processes.state(rank) == "D", "the orphan to freeze", timeout=30)
        froze_after = time.time() - orphan.since
        assert killable_for - 0.5 < froze_after < killable_for + 3, froze_after
        assert peer.run(f"ps -o stat= -p {peer.ns_pid_of(rank)}").stdout.strip().startswith("D")
        os.kill(rank, signal.SIGKILL)
        time.sleep(1.0)
        assert processes.is_alive(rank) and processes.state(rank) == "D"
        assert sim.in_use("ai002") == 1  # its domain, as long as it lives

        sim.thaw("ai002")  # the pending SIGKILL lands
        assert processes.wait_gone([rank], 5) == []
        settles(in_use(sim, "ai002"), [0])  # release mode: it died


def test_within_the_killable_window_sigkill_ends_the_orphan(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
) -> None:
    sim = make_sim(killable_for=30.0, on_sigkill="keep")
    peer = clean_cluster.node("ai002")
    with launch_jaccl(clean_cluster, sim, ["ai001", "ai002"], [str(programs["loop"])]) as run:
        run.wait_for_output("rank 1 looping")
        run.wait_for_output("rank 0 looping")
        [rank] = rank_pids(peer, str(programs["loop"]))
        crash_launcher_and_head_rank(clean_cluster, run, str(programs["loop"]))
        orphan = sim.wait_for_orphan("ai002")
        assert orphan.host_pid == rank and not orphan.stuck

        os.kill(rank, signal.SIGTERM)
        time.sleep(0.5)
        assert processes.is_alive(rank)
        os.kill(rank, signal.SIGKILL)
        assert processes.wait_gone([rank], 5) == []
    # Keep mode: SIGKILLed, it keeps its domain until ai002 reboots, as the dead head's does.
    assert sim.in_use("ai002") == 1 and sim.in_use("ai001") == 1
    assert [h.host_pid for h in sim.holders("ai002")] == [None]


# --- 5. everything that is not a JACCL rank -----------------------------------------------


def test_a_ring_launch_through_the_shim_runs_as_with_the_real_interpreter(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
    programs: dict[str, Path],
) -> None:
    sim = make_sim()
    hostfile = clean_cluster.hostfile(clean_cluster.workdir / "ring-2.json", ["ai001", "ai002"])
    seen = {}
    for python in (clean_cluster.python, str(sim.python)):
        launch_args = ["--python", python, "--starting-port", str(next(_ports))]
        with start_launch(
            clean_cluster, hostfile, [str(programs["ring"])], launch_args=launch_args
        ) as run:
            assert run.wait(timeout=60) == 0, run.output()
        seen[python] = sorted(line for line in output_lines(run) if line)
    assert (
        seen[str(sim.python)]
        == seen[clean_cluster.python]
        == [
            "rank 0 of 2 sum 3 init from mlx.core.distributed simulated=False",
            "rank 1 of 2 sum 3 init from mlx.core.distributed simulated=False",
        ]
    )
    assert sim.in_use("ai001") == sim.in_use("ai002") == 0


def test_the_shim_is_the_real_interpreter_outside_a_jaccl_rank_and_refuses_without_config(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
) -> None:
    sim = make_sim()
    probe = (
        "import sys, mlx.core as mx; print(sys.executable, mx.distributed.init.__module__,"
        " 'mlx_medic_testbed_jaccl_rank' in sys.modules)"
    )
    plain = subprocess.run(
        [str(sim.python), "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert plain.stdout.split() == [clean_cluster.python, "mlx.core.distributed", "False"]
    assert plain.stderr == ""

    # With the JACCL environment, only a process that imports mlx gets the simulated init.
    devices = clean_cluster.workdir / "devices.json"
    devices.write_text(json.dumps([[None, "rdma_ai002"], ["rdma_ai001", None]]))
    jaccl_env = {
        **os.environ,
        "MLX_RANK": "0",
        "MLX_IBV_DEVICES": str(devices),
        "MLX_JACCL_COORDINATOR": "127.0.0.2:40000",
    }
    guard_like = subprocess.run(  # the product's rank guard, before it execs the rank
        [str(sim.python), "-c", "import sys; print('mlx.core' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=jaccl_env,
    )
    assert (guard_like.stdout, guard_like.stderr) == ("False\n", "")
    patched = subprocess.run(
        [str(sim.python), "-c", probe], capture_output=True, text=True, timeout=60, env=jaccl_env
    )
    assert patched.stdout.split()[1:] == ["mlx_medic_testbed_jaccl_rank", "True"]

    # A sitecustomize the shim's would shadow still runs.
    shadowed = clean_cluster.workdir / f"shadowed-{uuid.uuid4().hex[:8]}"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("print('shadowed sitecustomize ran')\n")
    chained = subprocess.run(
        [str(sim.python), "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(shadowed)},
    )
    assert chained.stdout == "shadowed sitecustomize ran\n"

    sim.config_path.write_text("{not json")
    broken = subprocess.run(
        [str(sim.python), "-c", probe], capture_output=True, text=True, timeout=60, env=jaccl_env
    )
    assert broken.returncode == 2 and broken.stdout == ""
    assert "refusing to simulate JACCL" in broken.stderr

    sim.config_path.unlink()
    missing = subprocess.run(
        [str(sim.python), "-c", "print('ran')"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and missing.stdout == ""
    assert "refusing to simulate JACCL" in missing.stderr
    assert str(sim.config_path) in missing.stderr and "missing or unreadable" in missing.stderr


def test_the_simulators_groups_are_the_testbeds_own_and_go_with_it(
    clean_cluster: Cluster,
    make_sim: Callable[..., JacclSim],
) -> None:
    from testbed.freezer import GROUP_PREFIX, OWNERS_DIR

    sim = make_sim()
    groups = [sim.freezer_group(node.name) for node in clean_cluster.nodes]
    for group in groups:
        assert group.path.name.startswith(GROUP_PREFIX) and group.state == "FROZEN"
        assert (OWNERS_DIR / group.path.name).read_text().split()[0] == str(os.getpid())
    sim.close()
    assert not any(group.path.exists() for group in groups)
    assert not any((OWNERS_DIR / group.path.name).exists() for group in groups)
    assert sim._on_reboot not in clean_cluster.reboot_hooks
