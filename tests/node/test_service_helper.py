"""`mlx-medic node service`: the manager's own command stops, starts and restarts the
model's service on its head; "stopped by run X" is on the head before the stop and gone
only after a start worked; a failing manager command leaves it and says why (exit 1).

supervisord runs inside the testbed head's own namespaces (never the host's), and the
helper runs there over ssh, as the remediator runs it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlx_medic.node.service_cli import already_stopped, run_manager
from mlx_medic.state.service_stop import read_service_stop, record_service_stop
from testbed import Cluster, SimNode
from testbed.keepalive import CONTROL
from tests.node.inventories import two_models
from tests.tools import require_tool

# supervisord's own sections, with a token in every path: each test its own daemon.
SUPERVISORD_CONTROL = CONTROL  # supervisord's own sections (testbed.keepalive)
SUPERVISORD_CONF = (
    SUPERVISORD_CONTROL
    + """\
[program:tiny-{token}]
command=sleep 100000
startsecs=0
"""
)


@dataclass
class Supervised:
    head: SimNode
    token: str
    conf: Path
    inventory: Path
    state_dir: Path  # the head's state dir, as the host sees it
    log: Path  # the model's log file (the workdir: the same path inside the head)
    log_text: str = "INFO an earlier start\n"

    def helper(self, *args: str, inventory: Path | None = None) -> subprocess.CompletedProcess[str]:
        line = shlex.join(
            [
                sys.executable,
                "-m",
                "mlx_medic.cli",
                "node",
                "service",
                "tiny",
                *args,
                "--inventory",
                str(inventory or self.inventory),
                "--node",
                "ai001",
                "--json",
            ]
        )
        return self.head.run(line, timeout=120, check=False)

    def program_state(self) -> str:
        result = self.head.run(
            f"supervisorctl -c {self.conf} status tiny-{self.token}", check=False
        )
        return result.stdout.split()[1]


def write_inventory(cluster: Cluster, token: str, config: Path) -> Path:
    path = cluster.workdir / f"service-{token}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(
        cluster.inventory_yaml(
            [
                {
                    "name": "tiny",
                    "model": "/models/tiny",
                    "nodes": ["ai001", "ai002"],
                    "port": 8080,
                    "log_files": [str(cluster.workdir / f"service-{token}.log")],
                    "service": {
                        "manager": "supervisord",
                        "label": f"tiny-{token}",
                        "config": str(config),
                    },
                    "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
                }
            ]
        )
    )
    return path


@pytest.fixture
def supervised(clean_cluster: Cluster) -> Iterator[Supervised]:
    require_tool("supervisord")
    token = uuid.uuid4().hex[:8]
    conf = clean_cluster.workdir / f"supervisord-{token}.conf"
    conf.write_text(SUPERVISORD_CONF.format(token=token))
    head = clean_cluster.head
    daemon = head.spawn(["supervisord", "-n", "-c", str(conf)])
    try:
        setup = Supervised(
            head,
            token,
            conf,
            write_inventory(clean_cluster, token, conf),
            head.state_dir,
            clean_cluster.workdir / f"service-{token}.log",
        )
        setup.log.write_text(setup.log_text)
        deadline = time.monotonic() + 30
        while setup.program_state() != "RUNNING":
            assert time.monotonic() < deadline, "supervisord did not start its program"
            time.sleep(0.2)
        yield setup
    finally:
        daemon.kill()  # the host-side nsenter; clean_cluster ends what ran inside the node
        daemon.wait(timeout=10)


def test_stop_records_the_run_then_really_stops_the_program(supervised: Supervised) -> None:
    result = supervised.helper("stop", "--by", "remediator run 12", "--reason", "model down")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["command"], document["action"], document["exit_status"]) == (
        "service",
        "stop",
        0,
    )
    # supervisord asked over the socket its config names, as supervisorctl would ask it
    assert document["argv"] is None
    assert document["rpc"] == {
        "socket": f"/tmp/supervisor-{supervised.token}.sock",
        "methods": ["supervisor.stopProcess"],
        "name": f"tiny-{supervised.token}",
    }
    assert document["stopped_by"]["run"] == "remediator run 12"
    assert document["stopped_by"]["reason"] == "model down"
    assert supervised.program_state() == "STOPPED"
    assert read_service_stop(supervised.state_dir, "tiny").run == "remediator run 12"
    # the manager's own time (its wait for the job's exit), kept apart in the run log
    assert isinstance(document["manager_seconds"], float) and document["manager_seconds"] >= 0

    status = json.loads(supervised.helper("status").stdout)
    assert status["stopped_by"]["run"] == "remediator run 12"

    again = supervised.helper("stop", "--by", "remediator run 13")  # already stopped: stopped
    assert again.returncode == 0, again.stderr


def test_start_really_starts_the_program_and_clears_the_record_after(
    supervised: Supervised,
) -> None:
    assert supervised.helper("stop", "--by", "run-1").returncode == 0
    result = supervised.helper("start", "--by", "run-1")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["stopped_by"] is None and document["cleared"]["run"] == "run-1"
    # where the model's log ended just before the start: a verify reads what it wrote
    assert document["log_sizes"] == {str(supervised.log): len(supervised.log_text)}
    assert supervised.program_state() == "RUNNING"
    assert read_service_stop(supervised.state_dir, "tiny") is None
    assert json.loads(supervised.helper("status").stdout)["stopped_by"] is None


def test_restart_really_restarts_the_program(supervised: Supervised) -> None:
    before = supervised.head.run(
        f"supervisorctl -c {supervised.conf} pid tiny-{supervised.token}"
    ).stdout.strip()
    result = supervised.helper("restart")
    assert result.returncode == 0, result.stderr
    after = supervised.head.run(
        f"supervisorctl -c {supervised.conf} pid tiny-{supervised.token}"
    ).stdout.strip()
    assert supervised.program_state() == "RUNNING" and after != before
    assert json.loads(result.stdout)["rpc"]["methods"] == [
        "supervisor.stopProcess",
        "supervisor.startProcess",
    ]


def test_a_failing_manager_command_leaves_the_record_and_exits_1_with_its_stderr(
    clean_cluster: Cluster,
    supervised: Supervised,
) -> None:
    missing = clean_cluster.workdir / f"missing-{supervised.token}.conf"
    broken = write_inventory(clean_cluster, supervised.token, missing)
    stop = supervised.helper("stop", "--by", "run-7", inventory=broken)
    assert stop.returncode == 1
    # a config it cannot read names no socket: supervisorctl runs and says why
    assert json.loads(stop.stdout)["argv"][:3] == ["supervisorctl", "-c", str(missing)]
    assert f"could not find config file {missing}" in json.loads(stop.stdout)["stderr"]
    assert f"could not find config file {missing}" in stop.stderr
    assert read_service_stop(supervised.state_dir, "tiny").run == "run-7"  # written first
    start = supervised.helper("start", inventory=broken)
    assert start.returncode == 1 and json.loads(start.stdout)["stopped_by"]["run"] == "run-7"
    assert read_service_stop(supervised.state_dir, "tiny").run == "run-7"  # never cleared


def test_service_runs_only_on_the_models_head_and_names_what_is_wrong(
    tmp_path: Path,
) -> None:
    config = tmp_path / "inventory.yaml"
    config.write_text(two_models(str(tmp_path / "state")))

    def node(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_medic.cli",
                "node",
                "service",
                *argv,
                "--inventory",
                str(config),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    elsewhere = node("m1", "status", "--node", "n2")
    assert elsewhere.returncode == 2 and "its head n1, not on n2" in elsewhere.stderr
    unknown = node("m9", "status", "--node", "n1")
    assert unknown.returncode == 2 and "model 'm9' is not in the inventory" in unknown.stderr
    not_here = node("m2", "status", "--node", "n1")
    assert not_here.returncode == 2 and "'m2' is not placed on node n1" in not_here.stderr
    record_service_stop(tmp_path / "state", "m1", "run-3", "test")
    status = node("m1", "status", "--node", "n1")
    assert status.returncode == 0 and json.loads(status.stdout)["stopped_by"]["run"] == "run-3"
    no_by = node("m1", "stop", "--node", "n1")
    assert no_by.returncode == 2 and "--by" in no_by.stderr


def test_a_launchd_bootout_of_a_job_that_is_not_loaded_counts_as_stopped() -> None:
    # launchctl's verbatim answer (nix-installer issue #1148): exit 3 and this line
    assert already_stopped("launchd", 3, "Boot-out failed: 3: No such process\n")
    assert not already_stopped("launchd", 1, "Boot-out failed: 1: Operation not permitted\n")
    assert not already_stopped("launchd", 5, "Boot-out failed: 5: Input/output error\n")
    assert not already_stopped("systemd", 3, "Boot-out failed: 3: No such process\n")


def test_the_managers_command_is_run_and_read_whatever_it_prints_or_whether_it_runs(
    tmp_path: Path,
) -> None:
    garbled = tmp_path / "manager"
    garbled.write_text("#!/bin/sh\nprintf 'stopped \\377\\n'; printf 'warn \\376\\n' >&2; exit 3\n")
    garbled.chmod(0o755)
    assert run_manager([str(garbled)], 10) == (3, "stopped \ufffd\n", "warn \ufffd\n")
    unrunnable = tmp_path / "not-executable"
    unrunnable.write_text("#!/bin/sh\n")
    status, out, err = run_manager([str(unrunnable)], 10)
    assert (status, out) == (None, "") and "could not run" in err and "ermission" in err
    missing = str(tmp_path / "missing")
    assert run_manager([missing], 10) == (None, "", f"{missing}: not found")
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\necho begun\nexec sleep 30\n")
    slow.chmod(0o755)
    assert run_manager([str(slow)], 1) == (None, "begun\n", f"{slow} did not finish within 1s")
