"""`mlx-medic node sweep`, `clean` and `orphans` run inside real testbed nodes (real sshd,
real mlx.launch over ring): the seed's orphans and stale tmp entries go, and nothing else
does; the port guards, the pid-reuse check, an unkillable rank and the ledger, for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.state.runs import record_current_run
from testbed import Cluster, free_port, processes
from testbed.freezer import frozen
from testbed.launch import rank_pids
from testbed.node_users import NodeUser
from tests.exporter.test_seed_orphan import prepare, scrape, total, wait_ready
from tests.tools import three_users

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OLD = time.time() - 7200

# Holds a TCP port like a server (the other model's port), until killed.
LISTENER = """\
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[sys.argv.index("--host") + 1], int(sys.argv[sys.argv.index("--port") + 1])))
server.listen()
time.sleep(3600)
"""

# Answers the health probe (a one-token chat completion) on the model's port.
HEALTHY_SERVER = """\
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
BODY = json.dumps({"choices": [{"index": 0, "message": {"content": "x"}}]}).encode()
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler).serve_forever()
"""

# A rank that ignores SIGTERM (only SIGKILL ends it).
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"


def helper(cluster: Cluster, node: str, *argv: str) -> tuple[int, dict[str, Any], str]:
    """`mlx-medic node ARGV --json` inside the node: (exit status, document, stderr)."""
    popen = cluster.node(node).spawn(
        [cluster.python, "-m", "mlx_medic.cli", "node", *argv, "--json"],
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert out, f"no document from {argv} on {node}: {err.decode()}"
    return popen.returncode, json.loads(out), err.decode()


def spawn(cluster: Cluster, node: str, argv: list[str], **env: str) -> int:
    """A process inside the node; its host pid."""
    popen = cluster.node(node).spawn(
        argv,
        env=cluster.env(**env),
        cwd=str(cluster.workdir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return cluster.node(node).spawned_pid(popen)


def wait_until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def listening_on(pid: int, port: int) -> bool:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    try:
        return any(
            os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False


def ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def service_users(path: Path) -> Path:
    """In the three-user mode, `path` and what is in it made the service user's, as the
    model's dirs and leftovers are on a node (root's are `not ours` to the node user)."""
    if three_users():
        user = NodeUser()
        for entry in [path, *path.rglob("*")]:
            os.chown(entry, user.uid, user.gid, follow_symlinks=False)
    return path


def aged(path: Path) -> Path:
    """`path` made old (and the service user's: `service_users`)."""
    service_users(path)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(Path(root) / name, (OLD, OLD))
    os.utime(path, (OLD, OLD))
    return path


def test_sweep_and_clean_leave_no_orphan_and_no_stale_entry_and_nothing_else_goes(
    clean_cluster: Cluster, tiny_model: Path
):
    """The seed for real: run 1's mlx.launch is SIGKILLed (its rank 0 and ssh client stay
    on the head, its rank 1 under a sshd session on the peer), run 2 is the current run.
    `sweep --orphans-only`, then `clean`, on each node."""
    cluster = clean_cluster
    scenario = prepare(cluster, tiny_model)
    token, port, other_port = scenario.token, scenario.port, free_port()
    share = cluster.head.cache_mount / f"share-{token}"  # each node's own, same path
    scenario.inventory.write_text(
        cluster.inventory_yaml(
            [
                {
                    "name": "tiny",
                    "model": str(tiny_model),
                    "nodes": ["ai001", "ai002"],
                    "port": port,
                    "service": {"manager": "supervisord", "label": f"tiny-{token}"},
                    "backends": {"ring": {"hostfile": str(scenario.hostfile)}},
                    "process_patterns": {"rank": [rf"serve\.py --model \S+ --port {port}"]},
                    "tmp_dirs": [str(share)],
                    "policy": {"kill_grace": "5s", "stale_tmp_age": "10m"},
                },
                {
                    "name": "other",
                    "model": f"/models/other-{token}",
                    "nodes": ["ai001", "ai002"],
                    "port": other_port,
                    "service": {"manager": "supervisord", "label": f"other-{token}"},
                    "backends": {"ring": {"hostfile": str(scenario.hostfile)}},
                },
            ],
            launch_temp_dirs=["/tmp"],
        )
    )
    config = str(scenario.inventory)
    head, peer = cluster.node("ai001"), cluster.node("ai002")
    runs = []
    try:
        for attempt, run_id in enumerate((f"run1-{token}", f"run2-{token}")):
            for node in (head, peer):
                record_current_run(node.state_dir, "tiny", run_id)
            runs.append(
                scenario.launch(
                    attempt, "--env", f"MLX_MEDIC_RUN_ID={run_id}", "--env", "MLX_MEDIC_MODEL=tiny"
                )
            )
            wait_ready(runs[-1], 2)
            if attempt == 0:
                old_ranks = {n.name: rank_pids(n, str(scenario.script)) for n in (head, peer)}
                runs[0].kill()  # the crash: SIGKILL, no teardown
        current = {
            n.name: set(rank_pids(n, str(scenario.script))) - set(old_ranks[n.name])
            for n in (head, peer)
        }
        (old_peer_rank,) = old_ranks["ai002"]
        assert processes.cmdline(processes.ppid(old_peer_rank))[0].startswith("sshd:")

        # On each node, what must survive: a process a looser pattern (the seed's
        # `pgrep -f "serve\.py .*--port PORT"`) catches, a `tail -f` of the model's log, and a
        # process of the model listening on the other model's port.
        keep: dict[str, list[int]] = {}
        for node in (head, peer):
            share_here = node.host_path(share)
            share_here.mkdir(parents=True)
            (share_here / "serve.log").write_text("log\n")
            stale = aged(_entry(share_here / "tmpstale"))
            busy = aged(_entry(share_here / "tmpbusy"))
            _entry(share_here / "tmpfresh")
            busy_inside = share / "tmpbusy"  # a process works in it
            listener = cluster.workdir / f"listen-{token}.py"
            listener.write_text(LISTENER)
            keep[node.name] = [
                spawn(
                    cluster,
                    node.name,
                    [
                        cluster.python,
                        "-c",
                        "import time; time.sleep(600)",
                        "serve.py",
                        "--port",
                        str(port),
                    ],
                ),
                spawn(cluster, node.name, ["tail", "-f", str(share / "serve.log")]),
                spawn(cluster, node.name, ["sh", "-c", f"cd {busy_inside} && exec sleep 600"]),
                spawn(
                    cluster,
                    node.name,
                    [
                        cluster.python,
                        str(listener),
                        "--host",
                        node.address,
                        "--port",
                        str(other_port),
                    ],
                    MLX_RANK="0",
                    MLX_MEDIC_MODEL="tiny",
                ),
            ]
            squatter = keep[node.name][-1]
            wait_until(lambda: listening_on(squatter, other_port), "the listener")  # noqa: B023
            assert stale.exists() and busy.exists()

        inside = {
            pid: node.ns_pid_of(pid)
            for node in (head, peer)  # pids as the node sees them
            for pid in (*old_ranks[node.name], *current[node.name], *keep[node.name])
        }
        # The peer first: its orphan is the sshd-parented rank of run 1.
        for node in (peer, head):
            status, document, err = helper(
                cluster, node.name, "sweep", "tiny", "--orphans-only", "--inventory", config
            )
            assert status == 0 and document["complete"], err
            assert (document["mode"], document["node"]) == ("orphans-only", node.name)
            signalled = {s["pid"]: s for s in document["signalled"]}
            expected = {inside[p] for p in old_ranks[node.name]}
            assert expected <= set(signalled)
            assert {s["rule"] for s in signalled.values()} == {"stale_run_id"}
            # On the head, run 1's ssh client too, unless it ended with the peer's rank.
            roles = {s["role"] for s in signalled.values()}
            assert "rank" in roles
            assert roles <= ({"rank"} if node is peer else {"rank", "ssh_client"})
            assert set(document["exited"]) == set(signalled)
            spared = {s["pid"]: s["reason"] for s in document["spared"]}
            assert "other's port" in spared[inside[keep[node.name][3]]]
            for pid in current[node.name]:
                assert "current run" in spared[inside[pid]]
        for node in (head, peer):
            for pid in old_ranks[node.name]:
                wait_until(lambda: not processes.is_alive(pid), "the old rank to go")  # noqa: B023
            assert all(processes.is_alive(p) for p in current[node.name] | set(keep[node.name]))
            status, report, _ = helper(cluster, node.name, "orphans", "tiny", "--inventory", config)
            # The only orphan left is the one on the other model's port, which no sweep
            # touches (its launcher is gone: the exporter still shows it).
            squatter = inside[keep[node.name][3]]
            assert status == 0 and report["suspects"] == []
            assert [(o["pid"], o["rule"]) for o in report["orphans"]] == [
                (squatter, "launcher_gone")
            ]
        assert runs[1].alive()

        for node in (head, peer):
            # mlx.launch's files in /tmp, aged: an unowned hostfile is a dead launch's only
            # once it is old (a young one may be a launch under way); run 2's are in use.
            for leftover in node.tmp.glob("tmp.*"):
                os.utime(leftover, (OLD, OLD))
            status, document, err = helper(
                cluster, node.name, "clean", "tiny", "--inventory", config
            )
            assert status == 0, err
            removed = {(Path(r["path"]).name, r["kind"]) for r in document["removed"]}
            assert ("tmpstale", "stale_dir") in removed
            leftovers = {name for name, kind in removed if kind == "launch_leftover"}
            assert len(leftovers) >= 2, removed  # run 1's pid file and hostfile here
            assert document["bytes_freed"] > 0
            share_here = node.host_path(share)
            assert sorted(p.name for p in share_here.iterdir()) == [
                "serve.log",
                "tmpbusy",
                "tmpfresh",
            ]
            # Nothing stale is left: a dry run finds nothing more, and run 2 still runs.
            status, again, _ = helper(
                cluster, node.name, "clean", "tiny", "--dry-run", "--inventory", config
            )
            assert status == 0 and again["removed"] == []
            on_node = scrape(cluster, node.name, scenario.inventory)
            assert total(on_node, "mlx_orphan_processes", model="tiny") == 1  # the squatter
        assert runs[1].alive() and all(processes.is_alive(p) for n in current.values() for p in n)
    finally:
        for run in runs:
            run.close()


def _entry(path: Path) -> Path:
    path.mkdir()
    (path / "part").write_bytes(b"w" * 20000)
    return path


@pytest.fixture
def solo(clean_cluster: Cluster, tmp_path_factory) -> dict[str, Any]:
    """Model `solo` on ai003 only, port unique to the test, a short grace."""
    cluster = clean_cluster
    token = uuid.uuid4().hex[:8]
    port = free_port()
    hostfile = cluster.hostfile(cluster.workdir / f"solo-{token}.json", ["ai003"])
    inventory = cluster.workdir / f"solo-{token}.yaml"
    inventory.write_text(
        cluster.inventory_yaml(
            [
                {
                    "name": "solo",
                    "model": f"/models/solo-{token}",
                    "nodes": ["ai003"],
                    "port": port,
                    "service": {"manager": "supervisord", "label": f"solo-{token}"},
                    "backends": {"ring": {"hostfile": str(hostfile)}},
                    "policy": {"kill_grace": "1s"},
                }
            ]
        )
    )
    return {"cluster": cluster, "token": token, "port": port, "config": str(inventory)}


def test_guards_unkillable_ranks_and_the_ledger_on_a_node(solo: dict[str, Any]):
    """On ai003: a server answering the health probe on the model's port survives every
    sweep, the start sweep too (which reports it: another instance serves); a JACCL rank
    that ignores SIGTERM is SIGKILLed and spends one protection domain, which the
    exporter's ledger collector serves; a frozen JACCL rank (state D) is reported
    unkillable with its node and what frees it, recorded in the ledger once (one spend),
    and the sweep is settled: a start may go on around it."""
    cluster, token, port, config = solo["cluster"], solo["token"], solo["port"], solo["config"]
    node = cluster.node("ai003")
    server_script = cluster.workdir / f"healthy-{token}.py"
    server_script.write_text(HEALTHY_SERVER)
    devices = cluster.workdir / f"devices-{token}.json"
    devices.write_text('[[null, "rdma_en5"], ["rdma_en5", null]]')
    jaccl = {
        "MLX_RANK": "1",
        "MLX_IBV_DEVICES": str(devices),
        "MLX_JACCL_COORDINATOR": "127.0.0.9:5000",
    }
    server = spawn(
        cluster, "ai003", [cluster.python, str(server_script), "--port", str(port)], MLX_RANK="0"
    )
    stubborn = spawn(
        cluster, "ai003", [cluster.python, "-c", STUBBORN, "--port", str(port)], **jaccl
    )
    stuck = spawn(cluster, "ai003", [cluster.python, "-c", STUBBORN, "--port", str(port)], **jaccl)
    wait_until(lambda: listening_on(server, port), "the server")
    wait_until(lambda: ignores_sigterm(stubborn) and ignores_sigterm(stuck), "the handlers")
    inside = {pid: node.ns_pid_of(pid) for pid in (server, stubborn, stuck)}

    with frozen([stuck], token):
        for sweep_number in (1, 2):
            status, document, err = helper(cluster, "ai003", "sweep", "solo", "--inventory", config)
            assert status == 0 and document["settled"] and not document["complete"], err
            (unkillable,) = document["unkillable"]
            assert (
                unkillable["pid"],
                unkillable["state"],
                unkillable["devices"],
                unkillable["domains"],
            ) == (inside[stuck], "uninterruptible", ["rdma_en5"], 1)
            assert "survives SIGKILL" in err and "reboot ai003 to free 1 protection" in err
            (spared,) = document["spared"]
            assert spared["pid"] == inside[server]
            assert "answers the health probe" in spared["reason"]
            signalled = {s["pid"]: s["signals"] for s in document["signalled"]}
            assert signalled[inside[stuck]] == ["SIGTERM", "SIGKILL"]
            if sweep_number == 1:
                assert signalled[inside[stubborn]] == ["SIGTERM", "SIGKILL"]
                assert document["exited"] == [inside[stubborn]]
                assert document["pd_spent"] == 2
            else:
                assert document["pd_spent"] == 0  # the same frozen rank: one spend
        assert processes.is_alive(server) and processes.is_alive(stuck)
        status, ledger, _ = helper(cluster, "ai003", "ledger", "--inventory", config)
        assert ledger["debt"] == 2 and ledger["debt_by_unit"] == {"rdma_en5": 2}
        assert [e["pid"] for e in ledger["survivors"]] == [inside[stuck]]
        samples = scrape_ledger(cluster, config)
        assert samples["mlx_pd_debt"] == 2.0
    wait_until(lambda: not processes.is_alive(stuck), "the thawed rank to take its SIGKILL")

    status, document, err = helper(
        cluster, "ai003", "sweep", "solo", "--start-sweep", "--inventory", config
    )
    assert status == 0 and document["complete"], err
    assert document["mode"] == "start-sweep"
    assert document["listeners_signalled"] == []
    assert document["serving_listener"]["pid"] == inside[server]
    assert "another instance serves the model" in err
    assert processes.is_alive(server)


def scrape_ledger(cluster: Cluster, config: str) -> dict[str, float]:
    others = [
        f"--no-collector.{name}"
        for name in ("logs", "memory", "processes", "rdma", "service", "tmpdirs")
    ]
    popen = cluster.node("ai003").spawn(
        [
            cluster.python,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--once",
            "--inventory",
            config,
            "--node",
            "ai003",
            *others,
        ],
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert popen.returncode == 0, err.decode()
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(out.decode())
        for sample in family.samples
        if not sample.labels.keys() - {"node"}
    }


REUSE = """\
import json, os, subprocess, sys, time
from mlx_medic.inventory.load import load_inventory
from mlx_medic.node.sweep import NodeSweep, Seams
from mlx_medic.platform.process_table import system_process_table
from mlx_medic.processes.roles import PatternSet, classifier

inventory = load_inventory(sys.argv[1])
reborn = []

def reuse(proc, signal_name):
    # Between the listing and the signal, the listed process ends and a new process
    # with the same command line gets its pid (ns_last_pid: the next pid is ours to pick).
    if reborn:
        return
    os.kill(proc.pid, 9)
    while os.path.exists(f"/proc/{proc.pid}"):
        time.sleep(0.01)
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(proc.pid - 1))
        child = subprocess.Popen(list(proc.cmdline), stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        if child.pid == proc.pid:
            reborn.append(child)
            return
        child.kill()
        child.wait()
    raise SystemExit("the pid was not reused")

report = NodeSweep(inventory=inventory, model=inventory.model("solo"), node="ai003",
               state_dir=inventory.state_dir,
               table=system_process_table(classifier(PatternSet.of(inventory))),
               seams=Seams(before_signal=reuse)).run()
alive = bool(reborn) and reborn[0].poll() is None
for child in reborn:
    child.kill()
    child.wait()
print(json.dumps({"report": report.to_json(), "reborn": [c.pid for c in reborn],
                  "alive_after": alive}))
"""


def test_a_pid_reused_between_listing_and_signalling_is_not_hit(solo: dict[str, Any]):
    cluster, token, port, config = solo["cluster"], solo["token"], solo["port"], solo["config"]
    node = cluster.node("ai003")
    target = spawn(
        cluster,
        "ai003",
        [cluster.python, "-c", "import time; time.sleep(600)", "--port", str(port)],
        MLX_RANK="0",
    )
    target_inside = node.ns_pid_of(target)
    script = cluster.workdir / f"reuse-{token}.py"
    script.write_text(textwrap.dedent(REUSE))
    popen = node.spawn(
        [cluster.python, str(script), config],
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = popen.communicate(timeout=120)
    assert popen.returncode == 0, err.decode()
    result = json.loads(out)
    report = result["report"]
    assert result["reborn"] == [target_inside]  # the same pid, another process
    assert result["alive_after"] is True  # never hit
    assert report["exited"] == [] and report["survivors"] == []
    assert [s["signals"] for s in report["signalled"]] == []
    (spared,) = report["spared"]
    assert spared["pid"] == target_inside and "reused" in spared["reason"]
