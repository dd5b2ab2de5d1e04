"""Two remediator replicas behind two clustered Alertmanagers, for real.

The Alertmanagers gossip on loopback addresses named explicitly (nothing listens on
every address); each remediator replica runs in a UTS namespace of its own (its own host
name, hence its own name in the model lock) with its own journal and config, and both
are webhooks of the one receiver of both Alertmanagers. The model m1 (a stand-in server
under supervisord in the testbed head) is down and LLMModelDown fires at both
Alertmanagers, as Prometheus sends it: exactly one replica's recover run acts on the
nodes; the other's run ends `locked` naming its peer's host and pid, having done nothing;
`mlx-medic log` over both journals shows the two as one incident."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testbed import free_port
from tests.remediator.conftest import (
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


def in_uts_namespace(hostname: str) -> tuple[str, ...]:
    """argv that execs the rest in a new UTS namespace whose host name is `hostname`
    (unshare and sh both exec: the service keeps the pid it was started with)."""
    unshare = require_tool("unshare")
    return (unshare, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname)


def start_replica(stack: Stack, hostname: str) -> tuple[Service, Path]:
    """A remediator replica named `hostname` with its own journal and config: (it, its
    journal). An alert's run does not wait for a held lock (`lock_wait: 0s`): it ends
    `locked` at once, so which replica acted is never a race against the run's length."""
    journal = stack.workdir / f"journal-{hostname}.sqlite"
    config = stack.config(
        f"remediator-{hostname}.yml",
        journal=str(journal),
        lock_wait="0s",
        routing={"playbooks": {"LLMModelDown": "recover"}},
    )
    service = stack.start(config=config, journal=journal, wrapper=in_uts_namespace(hostname))
    return service, journal


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


def ended(journal: Path) -> list[dict[str, Any]]:
    return [r for r in runs_of(journal, "m1") if r["outcome"] not in ("queued", "running")]


def test_two_replicas_behind_two_clustered_alertmanagers_act_once(
    stack: Stack, tmp_path: Path, managers: list[Alertmanager]
) -> None:
    with stand_in_service(stack) as service:
        replicas = {name: start_replica(stack, name) for name in REPLICAS}
        urls = [replica.url + "/alerts" for replica, _ in replicas.values()]
        pair = start_pair(tmp_path / "am", alertmanager_config(urls, stack.token_file))
        managers.extend(pair)
        service.supervisorctl("stop")
        assert service.state() == "STOPPED"  # the model is down

        start = am_time(datetime.now(UTC) - timedelta(seconds=5))
        for manager in pair:  # Prometheus sends each alert to every Alertmanager
            manager.amtool(
                "alert", "add", "alertname=LLMModelDown", "model=m1", "severity=critical",
                f"--start={start}",
            )  # fmt: skip
        journals = [journal for _, journal in replicas.values()]
        wait_until(
            lambda: all(ended(journal) for journal in journals),
            timeout=120,
            interval=1,
            what="a run of each replica to end",
        )
        runs = {name: runs_of(journal, "m1") for name, (_, journal) in replicas.items()}
        shown = mlx_medic("log", "--model", "m1", *(f"--journal={j}" for j in journals)).stdout
        assert all(len(one) == 1 for one in runs.values()), shown  # one run each, no repeat
        (acting,) = [n for n, (run,) in runs.items() if run["outcome"] != "locked"]
        (waiting,) = [n for n in REPLICAS if n != acting]
        (run,) = runs[acting]
        assert (run["playbook"], run["outcome"]) == ("recover", "succeeded"), shown
        assert [s["name"] for s in run["steps"]] == [
            "preflight",
            "stop-service",
            "sweep",
            "start-service",
            "verify",
        ], shown
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
        logged = json.loads(
            mlx_medic(
                "log", "--model", "m1", "--json", *(f"--journal={j}" for j in journals)
            ).stdout
        )["runs"]
        assert sorted((r["replica"], r["outcome"]) for r in logged) == sorted(
            [(acting, "succeeded"), (waiting, "locked")]
        )
