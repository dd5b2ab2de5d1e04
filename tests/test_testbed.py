"""The testbed itself: simulated nodes behave like separate machines reached over real ssh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from testbed import Cluster, free_port, processes, start_cluster, wait_listening
from testbed.cluster import BOOT_ID
from testbed.freezer import FREEZER_ROOT, GROUP_PREFIX, frozen
from testbed.launch import rank_pids, start_launch
from tests.tools import require_root, require_tool

pytestmark = pytest.mark.testbed

ALL_SUM = """\
import sys, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]))
mx.eval(total)
print(f"rank {group.rank()} of {group.size()} sum {total.item():g}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture(scope="module")
def all_sum_script(cluster: Cluster) -> Path:
    """A ring all_sum script where every node can read it (outside /tmp)."""
    path = cluster.workdir / "all_sum.py"
    path.write_text(ALL_SUM)
    return path


def _sleeper(cluster: Cluster, node_name: str) -> int:
    """Start a long `sleep` inside a node; return its host pid."""
    node = cluster.node(node_name)
    return node.spawned_pid(node.spawn(["sleep", "600"]))


def test_every_node_answers_ssh_with_its_pinned_host_key(clean_cluster: Cluster) -> None:
    for node in clean_cluster.nodes:
        by_name = node.run("echo ok")
        assert by_name.stdout.strip() == "ok"
        by_address = subprocess.run(
            [str(clean_cluster.bin_dir / "ssh"), node.address, "echo ok"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert by_address.stdout.strip() == "ok"
    known = clean_cluster.known_hosts.read_text().splitlines()
    assert len(known) == len(clean_cluster.nodes)
    config = clean_cluster.ssh_config.read_text()
    assert "StrictHostKeyChecking yes" in config
    assert "StrictHostKeyChecking no" not in config


def _ssh_with_known_hosts(
    cluster: Cluster, known_hosts: Path, node_name: str
) -> subprocess.CompletedProcess[str]:
    options = ["-F", str(cluster.ssh_config), "-o", f"UserKnownHostsFile={known_hosts}"]
    return subprocess.run(
        ["ssh", *options, node_name, "echo reached"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_node_whose_host_key_is_not_the_pinned_one_is_refused(
    clean_cluster: Cluster, tmp_path: Path
) -> None:
    first, second = clean_cluster.nodes[0], clean_cluster.nodes[1]
    # A known_hosts that pins the second node's key for the first node's address.
    wrong = tmp_path / "known_hosts"
    key_type, key = (second.root / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    wrong.write_text(f"{first.address} {key_type} {key}\n")
    result = _ssh_with_known_hosts(clean_cluster, wrong, first.name)
    assert result.returncode == 255
    assert "reached" not in result.stdout
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_a_node_missing_from_known_hosts_is_refused_not_trusted_on_first_use(
    clean_cluster: Cluster, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    result = _ssh_with_known_hosts(clean_cluster, empty, clean_cluster.head.name)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
    assert empty.read_text() == ""


def test_each_node_sees_only_its_own_processes(clean_cluster: Cluster) -> None:
    sleeper = _sleeper(clean_cluster, "ai002")
    inside = clean_cluster.node("ai002").ns_pid_of(sleeper)
    for node in clean_cluster.nodes:
        listing = node.run("ps -e -o pid=,args=").stdout
        rows = {
            int(pid): args for pid, args in (line.split(None, 1) for line in listing.splitlines())
        }
        assert rows[1].startswith("sshd: ")
        assert node.ns_pid_of(node.init_pid) == 1
        sleepers = [pid for pid, args in rows.items() if args.strip() == "sleep 600"]
        assert sleepers == ([inside] if node.name == "ai002" else [])
        # Only pid 1, this ssh session and whatever the test started: no host processes.
        assert len(rows) < 8, rows
    namespaces = {node.pid_namespace for node in clean_cluster.nodes}
    assert len(namespaces) == len(clean_cluster.nodes)
    assert processes.pid_namespace(os.getpid()) not in namespaces


def test_tmp_is_private_per_node_and_readable_from_the_host(clean_cluster: Cluster) -> None:
    token = uuid.uuid4().hex
    first, second = clean_cluster.nodes[0], clean_cluster.nodes[1]
    first.run(f"echo {token} > /tmp/marker-{token}")
    assert (first.tmp / f"marker-{token}").read_text().strip() == token
    assert not (second.tmp / f"marker-{token}").exists()
    assert second.run(f"test -e /tmp/marker-{token}", check=False).returncode == 1
    assert not Path(f"/tmp/marker-{token}").exists()


def test_the_cache_dir_is_one_path_inside_every_node_but_private_to_each(
    clean_cluster: Cluster,
) -> None:
    first, second = clean_cluster.nodes[0], clean_cluster.nodes[1]
    assert first.cache_mount == second.cache_mount
    first.run(f"echo first > {first.cache_mount}/owner")
    assert (first.cache / "owner").read_text().strip() == "first"
    assert not (second.cache / "owner").exists()
    assert first.host_path(first.cache_mount / "owner") == first.cache / "owner"
    assert first.host_path("/tmp/x") == first.tmp / "x"


def test_every_node_has_a_boot_id_of_its_own_which_its_processes_read(
    clean_cluster: Cluster,
) -> None:
    """The nodes share the host's kernel; per-boot records (the protection-domain ledger)
    need each node's own boot, so a file is bound over the kernel's boot id in each."""
    host_boot_id = BOOT_ID.read_text().strip()
    ids = [node.boot_id for node in clean_cluster.nodes]
    assert len(set(ids)) == len(ids) and host_boot_id not in ids
    probe = (
        f"{clean_cluster.python} -c 'from mlx_medic.node.boot_id import current_boot_id;"
        " print(current_boot_id())'"
    )
    for node in clean_cluster.nodes:
        assert str(uuid.UUID(node.boot_id)) == node.boot_id  # a uuid, as the kernel's is
        over_ssh = node.run(f"cat {BOOT_ID}; {probe}").stdout.split()
        assert over_ssh == [node.boot_id, node.boot_id]
        spawned = node.spawn(["cat", str(BOOT_ID)], stdout=subprocess.PIPE)
        assert spawned.communicate(timeout=30)[0].decode().strip() == node.boot_id
    assert BOOT_ID.read_text().strip() == host_boot_id  # the host's own is untouched


def test_every_node_knows_its_inventory_name_from_its_state_dir_not_its_host_name(
    clean_cluster: Cluster,
) -> None:
    host_names = set()
    for node in clean_cluster.nodes:
        answer = node.run(f"cat {node.state_mount}/node-id; hostname").stdout.split()
        assert answer[0] == node.name
        host_names.add(answer[1])
    assert len(host_names) == 1  # one machine's name for every node: no identity
    node = clean_cluster.node("ai002")
    node.wipe_private_dirs()  # what clean_cluster does after every test
    assert (node.state_dir / "node-id").read_text() == "ai002\n"


@pytest.mark.parametrize("head_local", [True, False], ids=["head-local", "head-over-ssh"])
def test_mlx_launch_over_ring_across_head_and_a_peer_computes_a_correct_all_sum(
    clean_cluster: Cluster, all_sum_script: Path, head_local: bool
) -> None:
    hostfile = clean_cluster.hostfile(
        clean_cluster.workdir / "ring-2.json", ["ai001", "ai002"], head_local=head_local
    )
    entries = json.loads(hostfile.read_text())
    head_address = clean_cluster.node("ai001").address
    assert entries[0] == {"ssh": "127.0.0.1" if head_local else head_address, "ips": [head_address]}
    assert entries[1]["ssh"] == clean_cluster.node("ai002").address
    with start_launch(clean_cluster, hostfile, [clean_cluster.python, str(all_sum_script)]) as run:
        assert run.wait(timeout=120) == 0, run.output()
        out = run.output()
    assert "rank 0 of 2 sum 3" in out
    assert "rank 1 of 2 sum 3" in out


def test_killing_the_launcher_leaves_the_peer_rank_alive_under_its_sshd_session(
    clean_cluster: Cluster, all_sum_script: Path
) -> None:
    """The seed's orphan: a peer rank whose parent is `sshd`, so `ppid == 1` misses it."""
    head, peer = clean_cluster.node("ai001"), clean_cluster.node("ai002")
    hostfile = clean_cluster.hostfile(clean_cluster.workdir / "ring-2.json", ["ai001", "ai002"])
    argv = [clean_cluster.python, str(all_sum_script), "600"]
    with start_launch(clean_cluster, hostfile, argv) as run:
        run.wait_for_output("rank 0 of 2", timeout=120)
        run.wait_for_output("rank 1 of 2", timeout=120)
        run.kill()
        assert not run.alive()
        time.sleep(1.0)

        [orphan] = rank_pids(peer, str(all_sum_script))
        parent = processes.ppid(orphan)
        assert processes.is_alive(orphan)
        assert processes.cmdline(parent)[0].startswith("sshd: root@pts/")
        assert peer.ns_pid_of(parent) != 1
        ps_ppid = peer.run(f"ps -o ppid= -p {peer.ns_pid_of(orphan)}").stdout.strip()
        assert ps_ppid != "1"

        # On the head, the local rank and the ssh -tt client are adopted by pid 1.
        [local_rank] = rank_pids(head, str(all_sum_script))
        assert head.ns_pid_of(processes.ppid(local_rank)) == 1
        [client] = [p for p in head.find_pids("-tt") if processes.cmdline(p)[0].endswith("ssh")]
        assert head.ns_pid_of(processes.ppid(client)) == 1
        # mlx.launch's mktemp pid file and hostfile stay in the peer's /tmp.
        assert len(list(peer.tmp.glob("tmp.*"))) >= 2


def test_the_tiny_model_is_served_by_real_mlx_lm_server(
    clean_cluster: Cluster, tiny_model: Path
) -> None:
    head = clean_cluster.head
    port = free_port(head.address)
    argv = [clean_cluster.python, "-m", "mlx_lm.server", "--model", str(tiny_model)]
    server = head.spawn(
        [*argv, "--host", head.address, "--port", str(port)],
        env=clean_cluster.env(HF_HUB_OFFLINE="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(head.address, port, timeout=120)
        body = json.dumps(
            {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5}
        ).encode()
        request = urllib.request.Request(
            f"http://{head.address}:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert answer["object"] == "chat.completion"
        assert answer["usage"]["completion_tokens"] > 0
        assert answer["choices"][0]["message"]["role"] == "assistant"
    finally:
        server.kill()
        server.wait()


def test_a_frozen_process_shows_d_and_survives_sigkill_until_thawed(
    clean_cluster: Cluster,
) -> None:
    node = clean_cluster.node("ai003")
    token = uuid.uuid4().hex[:12]
    target = _sleeper(clean_cluster, "ai003")
    with frozen([target], token) as group:
        assert group.state == "FROZEN"
        assert processes.state(target) == "D"
        stat = node.run(f"ps -o stat= -p {node.ns_pid_of(target)}").stdout.strip()
        assert stat.startswith("D")
        os.kill(target, signal.SIGKILL)
        time.sleep(0.5)
        assert processes.is_alive(target)
    assert processes.wait_gone([target], 5.0) == []
    assert not (FREEZER_ROOT / f"{GROUP_PREFIX}{token}").exists()


def test_kill_all_but_sshd_ends_everything_in_a_node_even_frozen(clean_cluster: Cluster) -> None:
    node = clean_cluster.node("ai002")
    token = uuid.uuid4().hex[:12]
    stray = _sleeper(clean_cluster, "ai002")
    target = _sleeper(clean_cluster, "ai002")
    with frozen([target], token):
        node.kill_all_but_sshd()
        assert processes.wait_gone([stray, target], 5.0) == []
    # a killed process stays listed as a zombie until its parent (nsenter, on the host)
    # reaps it, which a loaded machine may delay: ended means gone or a zombie
    deadline = time.monotonic() + 5.0
    while left := [
        (pid, processes.state(pid))
        for pid in node.host_pids()
        if pid != node.init_pid and processes.is_alive(pid)
    ]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
    assert node.init_pid in node.host_pids()


def test_a_rebooted_node_ends_even_frozen_processes_and_comes_back_with_a_new_boot_id(
    clean_cluster: Cluster,
) -> None:
    node = clean_cluster.node("ai003")
    token = uuid.uuid4().hex[:12]
    target = _sleeper(clean_cluster, "ai003")
    (node.tmp / "left-behind").write_text("x")
    (node.cache / "kept").write_text("x")
    old_init, old_boot_id = node.init_pid, node.boot_id
    rebooted: list[str] = []
    clean_cluster.reboot_hooks.append(lambda n: rebooted.append(n.name))
    try:
        with frozen([target], token):
            clean_cluster.reboot("ai003")
            assert processes.wait_gone([target, old_init], 5.0) == []
    finally:
        clean_cluster.reboot_hooks.pop()
    assert node.init_pid != old_init
    assert rebooted == ["ai003"]  # after it is up again (a simulator's pools are cleared)
    assert node.boot_id != old_boot_id
    assert node.run(f"cat {BOOT_ID}").stdout.strip() == node.boot_id

    # Nothing but the new sshd and, for a moment, its per-connection children (the readiness
    # probe's): processes of the old namespace cannot be in the new one.
    def others() -> dict[int, list[str]]:
        found = {pid: processes.cmdline(pid) for pid in node.host_pids() if pid != node.init_pid}
        return {pid: argv for pid, argv in found.items() if not (argv and "sshd" in argv[0])}

    deadline = time.monotonic() + 15
    while others() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert others() == {}
    assert node.run("echo back").stdout.strip() == "back"  # same pinned host key
    assert not (node.tmp / "left-behind").exists()
    assert (node.cache / "kept").exists()


def test_teardown_leaves_no_process_and_no_freezer_group() -> None:
    require_root()
    require_tool("sshd")
    workdir = Path("/var/tmp") / f"mlx-medic-testbed-teardown-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4().hex[:12]
    try:
        cluster = start_cluster(2, workdir, first_address=100)
        pids = [p for node in cluster.nodes for p in (node.unshare_pid, node.init_pid)]
        target = _sleeper(cluster, "ai002")
        context = frozen([target], token)
        context.__enter__()  # left frozen on purpose: close() must thaw it
        pids += [target]
        namespaces = [node.pid_namespace for node in cluster.nodes]
        cluster.close()
        cluster.close()  # idempotent
        assert processes.wait_gone(pids, 5.0) == []
        assert all(processes.pids_in_namespace(ns) == [] for ns in namespaces)
        assert not (FREEZER_ROOT / f"{GROUP_PREFIX}{token}").exists()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_workdir_under_tmp_is_refused_with_the_reason() -> None:
    require_root()
    with pytest.raises(ValueError, match="own /tmp"):
        start_cluster(1, Path("/tmp") / f"testbed-{uuid.uuid4().hex[:8]}")


def _post_json(url: str, payload: dict[str, object], timeout: float = 60) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_tiny_model_is_served_across_head_and_peer_with_pipeline_over_ring(
    clean_cluster: Cluster, tiny_model: Path
) -> None:
    head = clean_cluster.head
    port = free_port(head.address)
    hostfile = clean_cluster.hostfile(clean_cluster.workdir / "ring-2.json", ["ai001", "ai002"])
    argv = [clean_cluster.python, "-m", "mlx_lm", "server", "--model", str(tiny_model)]
    argv += ["--pipeline", "--host", head.address, "--port", str(port)]
    with start_launch(clean_cluster, hostfile, argv, env=clean_cluster.env(HF_HUB_OFFLINE="1")):
        wait_listening(head.address, port, timeout=120)
        url = f"http://{head.address}:{port}/v1/completions"
        answer = _post_json(url, {"prompt": "The quick brown fox", "max_tokens": 4}, 120)
        assert answer["object"] == "text_completion"
        assert rank_pids(clean_cluster.node("ai002"), str(tiny_model))


def test_the_inventory_names_every_node_with_its_address_and_the_pinned_keys(
    cluster: Cluster, tiny_model: Path
) -> None:
    from mlx_medic.inventory.load import parse_inventory

    hostfile = cluster.workdir / "inventory-ring.json"
    model = {
        "name": "tiny",
        "model": str(tiny_model),
        "nodes": ["ai001", "ai002"],
        "port": 18080,
        "service": {"manager": "supervisord", "label": "tiny"},
        "backends": {"ring": {"hostfile": str(hostfile), "pipeline": True}},
        "tmp_dirs": ["/tmp/mlx-share/tiny"],
        "cache_dirs": [str(cluster.head.cache_mount)],
    }
    inventory = parse_inventory(cluster.inventory_yaml([model]))
    assert [n.name for n in inventory.nodes] == ["ai001", "ai002", "ai003"]
    assert inventory.node("ai002").ssh == cluster.node("ai002").address
    assert inventory.ssh.known_hosts == cluster.known_hosts
    assert inventory.ssh.identity_file == cluster.identity
    assert inventory.model("tiny").head == "ai001"


def test_a_jaccl_hostfile_lists_one_rdma_device_per_peer_and_null_for_self(
    cluster: Cluster, tmp_path: Path
) -> None:
    entries = json.loads(cluster.hostfile(tmp_path / "jaccl.json", backend="jaccl").read_text())
    assert [entry["rdma"][index] for index, entry in enumerate(entries)] == [None, None, None]
    assert all(len(entry["rdma"]) == 3 for entry in entries)
    with pytest.raises(ValueError, match="mpi"):
        cluster.hostfile(tmp_path / "bad.json", backend="mpi")


STARTER = """\
import json, sys, time
from pathlib import Path
from testbed import start_cluster
cluster = start_cluster(1, Path(sys.argv[1]), first_address=150)
node = cluster.nodes[0]
print(json.dumps([node.unshare_pid, node.init_pid, node.pid_namespace]), flush=True)
time.sleep(600)
"""


def test_the_nodes_die_with_the_python_that_started_them_even_on_sigkill() -> None:
    """pytest itself being killed must not leave nodes behind (PR_SET_PDEATHSIG)."""
    require_root()
    require_tool("sshd")
    workdir = Path("/var/tmp") / f"mlx-medic-testbed-owner-{uuid.uuid4().hex[:8]}"
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert owner.stdout is not None
        unshare_pid, init_pid, namespace = json.loads(owner.stdout.readline())
        assert processes.is_alive(init_pid)
        owner.kill()
        owner.wait(timeout=10)
        assert processes.wait_gone([unshare_pid, init_pid], 10.0) == []
        # Nothing runs in the namespace (pid 1 may linger as a zombie until host init reaps it).
        assert processes.wait_gone(processes.pids_in_namespace(namespace), 5.0) == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def test_python_m_testbed_up_serves_nodes_until_interrupted() -> None:
    require_root()
    require_tool("sshd")
    workdir = Path("/var/tmp") / f"mlx-medic-testbed-cli-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "testbed", "up", "--nodes", "1", "--workdir", str(workdir)]
    up = subprocess.Popen(
        [*command, "--first-address", "160"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert up.stdout is not None
        lines = [up.stdout.readline() for _ in range(5)]
        assert lines[-1].startswith("Ctrl-C")
        config = workdir / "ssh" / "ssh_config"
        assert lines[1].split() == ["ssh", "config", str(config)]
        reached = subprocess.run(
            ["ssh", "-F", str(config), "ai001", "echo", "reached"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert reached.stdout.strip() == "reached"
        init_pid = int(lines[3].split("nsenter -t ")[1].split()[0])
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
        assert processes.wait_gone([init_pid], 5.0) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        shutil.rmtree(workdir, ignore_errors=True)
