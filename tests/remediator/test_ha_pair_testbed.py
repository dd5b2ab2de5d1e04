"""Two remediator replicas behind two clustered Alertmanagers, for real.

The Alertmanagers gossip on loopback addresses named explicitly (nothing listens on
every address); each remediator replica runs in a UTS namespace of its own (its own host
name, hence its own name in the model lock) with its own journal and config, and both
are webhooks of the one receiver of both Alertmanagers. The model m1 (a stand-in server
under supervisord in the testbed head) is down and LLMModelDown fires at both
Alertmanagers, as Prometheus sends it: exactly one replica's recover run acts on the
nodes; the other's run ends `locked` naming its peer's host and pid, having done nothing;
`mlx-medic log` over both journals shows the two as one incident. And the acting replica
SIGKILLed mid-run, right after it stopped the service (the head's record of the stop
names its run, pid and host): once its lock's lease runs out, the other replica's run on
the next notification breaks the stale lock, finds that record at its own stop and
journals whose it was, sweeps, starts (clearing the record) and verifies; the service is
not left stopped. Every node runs this checkout's node helpers."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.journal import Journal
from mlx_medic.state.service_stop import read_service_stop
from testbed import free_port
from tests.node.inventories import checkout_medic
from tests.remediator.conftest import (
    PEER_TIMEOUT,
    Alertmanager,
    Service,
    Stack,
    alertmanager_config,
    am_time,
    http,
    mlx_medic,
    runs_of,
    start_alertmanager,
    wait_until,
)
from tests.remediator.stand_in import stand_in_service
from tests.tools import require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPLICAS = ("medic-a", "medic-b")
RECOVER_STEPS = ["preflight", "stop-service", "sweep", "start-service", "verify"]
LOCK_WAIT = 5.0  # the kill test's: a run waits this long for a held lock


def in_uts_namespace(hostname: str) -> tuple[str, ...]:
    """argv that execs the rest in a new UTS namespace whose host name is `hostname`
    (unshare and sh both exec: the service keeps the pid it was started with)."""
    unshare = require_tool("unshare")
    return (unshare, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname)


def start_replica(
    stack: Stack, hostname: str, lock_wait: str = "0s", **settings: Any
) -> tuple[Service, Path]:
    """A remediator replica named `hostname` with its own journal and config: (it, its
    journal). By default an alert's run does not wait for a held lock (`lock_wait: 0s`):
    it ends `locked` at once, so which replica acted is never a race against the length of
    a run that lets go of the lock at its start step."""
    journal = stack.workdir / f"journal-{hostname}.sqlite"
    config = stack.config(
        f"remediator-{hostname}.yml",
        journal=str(journal),
        lock_wait=lock_wait,
        routing={"playbooks": {"LLMModelDown": "recover", "StopHold": "stop-then-hold"}},
        **settings,
    )
    service = stack.start(config=config, journal=journal, wrapper=in_uts_namespace(hostname))
    return service, journal


def checkout_on_nodes(stack: Stack) -> None:
    """Every node runs this checkout's mlx-medic (tests.node.inventories.checkout_medic)."""
    data = yaml.safe_load(stack.inventory.read_text())
    medic = str(checkout_medic(stack.inventory.parent))
    for node in data["nodes"].values():
        node["medic_command"] = medic
    stack.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def start_pair(workdir: Path, config: dict[str, Any]) -> list[Alertmanager]:
    """Two Alertmanagers clustered on 127.0.0.1, each the other's peer, returned once
    both see both peers (before that, a notification could go out from each)."""
    gossip = (free_port(), free_port())
    pair = [
        start_alertmanager(workdir / f"am{i}", config, gossip[i], (gossip[1 - i],))
        for i in range(2)
    ]

    def clustered() -> bool:
        for manager in pair:
            status, answer = http("GET", manager.url + "/api/v2/status")
            cluster = answer.get("cluster", {}) if status == 200 else {}
            if cluster.get("status") != "ready" or len(cluster.get("peers") or []) != 2:
                return False
        return True

    wait_until(clustered, timeout=60, interval=0.5, what="both Alertmanagers to see 2 peers")
    return pair


def ended(journal: Path, playbook: str) -> list[dict[str, Any]]:
    return [
        r
        for r in runs_of(journal, "m1")
        if r["playbook"] == playbook and r["outcome"] not in ("queued", "running")
    ]


def fire(pair: list[Alertmanager], alertname: str) -> None:
    """The alert sent to each Alertmanager, as Prometheus sends it."""
    start = am_time(datetime.now(UTC) - timedelta(seconds=5))
    for manager in pair:
        manager.amtool(
            "alert", "add", f"alertname={alertname}", "model=m1", "severity=critical",
            f"--start={start}",
        )  # fmt: skip


def run_seconds(journal: Path, run_id: int) -> float | None:
    """A run's length, queued (or started) to ended, from the journal's own times."""
    reader = Journal(journal)
    try:
        view = reader.get_run(run_id)
        return None if view is None else view.duration
    finally:
        reader.close()


def merged_log(journals: list[Path], *args: str) -> str:
    """`mlx-medic log` of m1 over both replicas' journals."""
    return mlx_medic("log", "--model", "m1", *args, *(f"--journal={j}" for j in journals)).stdout


def test_two_replicas_behind_two_clustered_alertmanagers_act_once(
    stack: Stack, tmp_path: Path, managers: list[Alertmanager]
) -> None:
    checkout_on_nodes(stack)
    with stand_in_service(stack) as service:
        replicas = {name: start_replica(stack, name) for name in REPLICAS}
        urls = [replica.url + "/alerts" for replica, _ in replicas.values()]
        pair = start_pair(tmp_path / "am", alertmanager_config(urls, stack.token_file))
        managers.extend(pair)
        service.supervisorctl("stop")
        assert service.state() == "STOPPED"  # the model is down

        fire(pair, "LLMModelDown")
        journals = [journal for _, journal in replicas.values()]
        wait_until(
            lambda: all(ended(journal, "recover") for journal in journals),
            timeout=120,
            interval=1,
            what="a run of each replica to end",
        )
        # the second Alertmanager's turn has come and gone: it found the first one's
        # notifications in the gossiped log and sent none of its own
        time.sleep(PEER_TIMEOUT + 1)
        assert sorted(manager.notified() for manager in pair) == [0, 2]  # one per replica
        runs = {name: runs_of(journal, "m1") for name, (_, journal) in replicas.items()}
        shown = merged_log(journals)
        assert all(len(one) == 1 for one in runs.values()), shown  # one run each, no repeat
        (acting,) = [n for n, (run,) in runs.items() if run["outcome"] != "locked"]
        (waiting,) = [n for n in REPLICAS if n != acting]
        (run,) = runs[acting]
        assert (run["playbook"], run["outcome"]) == ("recover", "succeeded"), shown
        assert [s["name"] for s in run["steps"]] == RECOVER_STEPS, shown
        assert service.state() == "RUNNING"

        (locked,) = runs[waiting]
        assert locked["steps"] == [], shown  # it did nothing
        pid = replicas[acting][0].proc.pid
        assert locked["detail"].startswith(
            f"the model lock on ai001: locked by remediator (run {run['id']}, pid {pid} on"
            f" {acting}, off the inventory's nodes, since "
        ), locked["detail"]

        # One incident from both journals: each run named by its replica's host.
        assert f"{acting}#{run['id']}" in shown and f"{waiting}#{locked['id']}" in shown, shown
        logged = json.loads(merged_log(journals, "--json"))["runs"]
        assert sorted((r["replica"], r["outcome"]) for r in logged) == sorted(
            [(acting, "succeeded"), (waiting, "locked")]
        )


def test_the_acting_replica_killed_after_its_stop_the_other_finishes_the_recovery(
    stack: Stack, tmp_path: Path, managers: list[Alertmanager]
) -> None:
    """StopHold (a test playbook: stop the service, then hold the lock 60 s) at both
    Alertmanagers: one replica stops the service, the other's run waits its `lock_wait`
    (5 s here) and ends `locked`, having done nothing. The
    acting replica SIGKILLed: the head keeps its lock (its lease, 6 s here, no longer
    renewed) and its record of the stopped service. Once the lease ran out, LLMModelDown
    (the model is down) reaches the survivor, whose recover run breaks the stale lock,
    stops (already stopped: its stop journals the dead replica's record), sweeps, starts
    and verifies."""
    checkout_on_nodes(stack)
    with stand_in_service(stack) as service:
        replicas = {
            name: start_replica(stack, name, lock_wait=f"{LOCK_WAIT:g}s", lock_lease="6s")
            for name in REPLICAS
        }
        journals = [journal for _, journal in replicas.values()]
        urls = [replica.url + "/alerts" for replica, _ in replicas.values()]
        pair = start_pair(tmp_path / "am", alertmanager_config(urls, stack.token_file))
        managers.extend(pair)

        fire(pair, "StopHold")

        def stopped_and_locked() -> tuple[str, dict[str, Any]] | None:
            """(the acting replica, its run) once its stop ended ok and the other's run
            ended locked."""
            acting = [
                (name, run)
                for name, (_, journal) in replicas.items()
                for run in runs_of(journal, "m1")
                if any(s["name"] == "stop-service" and s["outcome"] == "ok" for s in run["steps"])
            ]
            locked = [run for journal in journals for run in ended(journal, "stop-then-hold")]
            if len(acting) == 1 and [r["outcome"] for r in locked] == ["locked"]:
                return acting[0]
            return None

        acting, killed_run = wait_until(
            stopped_and_locked, timeout=60, interval=0.5, what="one stop and one locked run"
        )
        (survivor,) = [name for name in REPLICAS if name != acting]
        (waited,) = ended(replicas[survivor][1], "stop-then-hold")
        assert waited["steps"] == [], waited  # it waited, then did nothing
        took = run_seconds(replicas[survivor][1], waited["id"])
        assert took is not None and took >= LOCK_WAIT, (took, waited)
        killed = replicas[acting][0]
        killed.stop(signal.SIGKILL)  # right after its stop, holding the lock
        assert service.state() == "STOPPED"
        head = stack.cluster.head
        record = read_service_stop(head.state_dir, "m1")
        # the record names the replica: its run, its pid and its host
        stopped_by = f"remediator run {killed_run['id']} (pid {killed.proc.pid} on {acting})"
        assert record is not None and record.run == stopped_by, record
        lock = json.loads(stack.lock_file("m1").read_text())
        assert (lock["host"], lock["pid"]) == (acting, killed.proc.pid)
        wait_until(
            lambda: lock["expires"] < time.time(), timeout=30, what="the dead holder's lease"
        )

        fire(pair, "LLMModelDown")  # the next notification: the model is down
        survivor_journal = replicas[survivor][1]
        (run,) = wait_until(
            lambda: ended(survivor_journal, "recover"),
            timeout=120,
            interval=1,
            what="the survivor's recover run to end",
        )
        shown = merged_log(journals)
        assert run["outcome"] == "succeeded", shown
        assert [s["name"] for s in run["steps"]] == RECOVER_STEPS, shown
        # its stop found the dead replica's record, and journaled whose it was
        (stop,) = [s for s in run["steps"] if s["name"] == "stop-service"]
        assert f"; found it stopped by {stopped_by} since " in stop["detail"], stop["detail"]
        assert stop["detail"].endswith(": this run sweeps, starts and clears it"), stop["detail"]
        assert service.state() == "RUNNING"  # not left stopped
        assert read_service_stop(head.state_dir, "m1") is None  # the start cleared it
        broke = [
            line["msg"]
            for line in replicas[survivor][0].log_lines()
            if "breaking stale lock" in str(line.get("msg"))
        ]
        assert broke == [f"breaking stale lock: holder's lease on {acting} ran out"], broke
        assert f"{survivor}#{run['id']}" in shown, shown
