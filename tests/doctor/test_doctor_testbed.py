"""`mlx-medic doctor` against a testbed cluster deployed as `mlx-medic render` writes it, in
the three-user mode: on each node as root (the install guide's step 6) and, with
`--config.file`, from the remediator's host over SSH as the remediator logs in.

A deployment as rendered passes every check, or says why one does not apply on Linux.
Each fault a new installation makes, put in one at a time, is named with its fix and a
non-zero exit. For the faults a node shows only when its helpers are called (its config
missing at `medic_config`, an older mlx-medic, a forced command without a helper the arm
needs), a real `mlx-medic remediate` ends `misconfigured` (exit 5), before any step that
acts: the model's service keeps running, the same process.

The model's service is a real supervisord program on the head, run as the node user and
listening on the model's port (a plain HTTP server: what the doctor checks is who runs
it and what the exporter can see of it, not MLX)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.command_line import version
from mlx_medic.node.cli import SCHEMA
from mlx_medic.remediator.journal import Journal
from mlx_medic.state.service_stop import read_service_stop
from testbed import Cluster, free_port, start_cluster, wait_listening
from testbed.keepalive import KeepAlive, keep_alive
from testbed.node_users import NodeUser, run_as
from tests.tools import require_root, require_tool

pytestmark = [pytest.mark.testbed]

USER = NodeUser()
MEDIC = str(Path(sys.executable).parent / "mlx-medic")
MODEL = "tiny"
EXIT_MISCONFIGURED = 5  # `mlx-medic remediate` (docs/exit-codes.md)
OLDER = "0.0.9"
# An mlx-medic as released before helper documents of this schema: the real one, whose
# documents it rewrites to an older schema and version.
OLDER_HELPER = f'''#!{sys.executable}
import json, subprocess, sys
if sys.argv[1:] == ["--version"]:
    print("mlx-medic {OLDER}")
    sys.exit(0)
real = subprocess.run([{MEDIC!r}, *sys.argv[1:]], capture_output=True, text=True)
try:
    document = json.loads(real.stdout)
except ValueError:
    document = None
if isinstance(document, dict) and "schema" in document:
    document.update(schema={SCHEMA - 1}, version="{OLDER}")
    real.stdout = json.dumps(document) + "\\n"
sys.stdout.write(real.stdout)
sys.stderr.write(real.stderr)
sys.exit(real.returncode)
'''
# This mlx-medic with one grant less in its forced command's table: `facts`, which every
# run's preflight sends to every node (an mlx-medic whose table predates a helper).
WITHOUT_FACTS = f"""#!{sys.executable}
import sys
from mlx_medic.node import key_table
key_table.TABLE["remediator"] = tuple(
    grant for grant in key_table.TABLE["remediator"] if grant.helper != "facts"
)
from mlx_medic.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Deployed:
    cluster: Cluster
    inventory: Path  # the remediator's copy
    config: Path  # the remediator's config
    service: KeepAlive

    def medic_command(self, node: str) -> Path:
        """The node's mlx-medic (`nodes.<node>.medic_command`): a script that runs this
        venv's, so a test can install another one in its place."""
        return self.cluster.workdir / "installed" / node / "mlx-medic"

    def medic_config(self, node: str) -> Path:
        """The node's copy of the inventory (`nodes.<node>.medic_config`)."""
        return self.cluster.workdir / "installed" / node / "inventory.yaml"

    def service_pid(self) -> int:
        status = self.service.ctl("status", self.service.program).stdout.split()
        assert status[1] == "RUNNING", status
        return int(status[status.index("pid") + 1].rstrip(","))


def install_medic_command(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def deployed(testbed_workdir: Path) -> Iterator[Deployed]:
    """Two nodes in the three-user mode with everything `render` writes installed, each
    with its own mlx-medic and its own copy of the inventory; the model's service runs."""
    require_root()
    for tool in ("sshd", "ssh", "unshare", "nsenter", "mount", "sudo", "visudo", "setpriv"):
        require_tool(tool)
    require_tool("supervisord")
    cluster = start_cluster(2, testbed_workdir / f"doctor-{uuid.uuid4().hex[:6]}", node_user=USER)
    rank: subprocess.Popen[bytes] | None = None
    service: KeepAlive | None = None
    try:
        port, label = free_port(), f"tiny-{uuid.uuid4().hex[:8]}"
        output = cluster.workdir / "service-output"  # the program (the node user) writes here
        output.mkdir()
        os.chown(output, USER.uid, USER.gid)
        service = keep_alive(
            cluster.head,
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
            workdir=cluster.workdir / "service",
            throttle=0.5,
            env=cluster.env(),
            name=label,
            user=USER.name,
            output_dir=output,
        )
        inventory = cluster.workdir / "inventory.yaml"
        setup = Deployed(cluster, inventory, cluster.workdir / "remediator.yaml", service)
        data = yaml.safe_load(
            cluster.inventory_yaml(
                [
                    {
                        "name": MODEL,
                        "model": "m",
                        "nodes": ["ai001", "ai002"],
                        "port": port,
                        "host": "127.0.0.1",
                        "service": {
                            "manager": "supervisord",
                            "label": label,
                            "config": str(service.conf),
                            "sudo": True,
                            "user": USER.name,
                        },
                        "backends": {
                            "ring": {
                                "hostfile": str(
                                    cluster.hostfile(
                                        cluster.workdir / "ring.json", ["ai001", "ai002"]
                                    )
                                )
                            }
                        },
                    }
                ],
                login_user=USER.name,
            )
        )
        data["ssh"]["identity_file"] = str(cluster.remediator_identity)
        data["ssh"]["remediator_addresses"] = ["127.0.0.1"]
        for name, node in data["nodes"].items():
            setup.medic_command(name).parent.mkdir(parents=True)
            install_medic_command(setup.medic_command(name), f'#!/bin/sh\nexec {MEDIC} "$@"\n')
            node.update(
                medic_command=str(setup.medic_command(name)),
                medic_config=str(setup.medic_config(name)),
            )
        text = yaml.safe_dump(data, sort_keys=False)
        for path in (inventory, setup.medic_config("ai001"), setup.medic_config("ai002")):
            path.write_text(text)
        cluster.deploy(inventory)
        setup.config.write_text(
            yaml.safe_dump(
                {"journal": str(cluster.workdir / "journal.sqlite"), "inventory": str(inventory)}
            )
        )
        # A rank of the model on the peer: a process of the service user there.
        rank = cluster.node("ai002").spawn([*run_as(USER), "sleep", "3600"])
        wait_listening("127.0.0.1", port, timeout=30)
        yield setup
    finally:
        if service is not None:
            service.close()
        if rank is not None:
            rank.kill()
            rank.wait(10)
        cluster.close()


# --- running the doctor, as the guide says ---------------------------------------------


def node_doctor(
    setup: Deployed, node: str, inventory: Path | None = None, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`mlx-medic doctor --inventory FILE --json` as root on `node` (by default with the
    node's own copy of the inventory); `path`: the PATH it runs with."""
    argv = [MEDIC, "doctor", "--inventory", str(inventory or setup.medic_config(node)), "--json"]
    if path is not None:
        argv = ["env", f"PATH={path}", *argv]
    return subprocess.run(
        setup.cluster.node(node).nsenter_argv(*argv, cwd="/"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cluster_doctor(setup: Deployed) -> subprocess.CompletedProcess[str]:
    """`mlx-medic doctor --config.file FILE --json` on the remediator's host (here)."""
    return subprocess.run(
        [MEDIC, "doctor", "--config.file", str(setup.config), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def checks(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(result.stdout)["checks"]
    return found


def failures(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [check for check in checks(result) if check["status"] == "failed"]


@contextlib.contextmanager
def replaced(path: Path, text: str | None) -> Iterator[None]:
    """`path` with `text` (None: no file there) for the with block, then as it was."""
    kept = path.read_bytes()
    mode = path.stat().st_mode
    try:
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
            path.chmod(mode)
        yield
    finally:
        path.write_bytes(kept)
        path.chmod(mode)


# --- a deployment as rendered ----------------------------------------------------------


@pytest.mark.parametrize("node", ["ai001", "ai002"])
def test_as_rendered_every_check_on_a_node_passes_or_says_why_it_does_not_apply(
    deployed: Deployed, node: str
) -> None:
    result = node_doctor(deployed, node)
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result)
    statuses = {check["name"].split()[0]: check["status"] for check in found}  # no subject
    assert set(statuses.values()) <= {"passed", "not-applicable"}, found
    for check in found:
        if check["status"] == "not-applicable":
            assert check["detail"], check  # the reason
    for name in ("medic-command", "medic-config", "interpreter", "forced-command"):
        assert statuses[name] == "passed", found
    assert statuses["process-visibility"] == "passed"  # the service user's processes
    assert statuses["ps-states"] == "not-applicable"  # macOS only, said so
    if node == "ai001":  # the head: its sudo rule and the service's socket
        assert statuses["sudo-rule"] == statuses["listening-sockets"] == "passed"
    assert json.loads(result.stdout)["unverified_on_hardware"]  # what no Mac confirmed yet


def test_as_rendered_every_helper_call_of_the_arm_answers_on_every_node_over_ssh(
    deployed: Deployed,
) -> None:
    result = cluster_doctor(deployed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""  # the report is the output: no SSH library chatter
    found = checks(result)
    assert {check["status"] for check in found} == {"passed"}
    assert {check["node"] for check in found} == {"ai001", "ai002"}
    calls = {(c["node"], c["name"]) for c in found}
    assert {("ai001", "lock tiny show"), ("ai002", "facts tiny")} <= calls
    assert f"as {USER.name}" in next(c["detail"] for c in found if c["name"] == "facts tiny")


# --- one fault at a time, on a node ----------------------------------------------------


def test_without_sudo_on_the_head_the_sudo_rule_fails_and_says_to_install_it(
    deployed: Deployed,
) -> None:
    empty = deployed.cluster.workdir / "no-tools"
    empty.mkdir(exist_ok=True)
    result = node_doctor(deployed, "ai001", path=str(empty))
    assert result.returncode == 1, result.stdout + result.stderr
    (failure,) = failures(result)
    assert failure["name"].startswith("sudo-rule")
    assert failure["detail"].startswith("sudo is not installed")
    assert failure["fix"].startswith("install sudo")


def test_a_sudo_rule_wider_than_rendered_fails_naming_what_differs(deployed: Deployed) -> None:
    rule_file = deployed.cluster.head.root / "etc" / "sudoers.d" / "mlx-medic"
    rendered = rule_file.read_text()
    first = next(line for line in rendered.splitlines() if line and not line.startswith("#"))
    who, command = first.split(" NOPASSWD: ", 1)
    tool = command.split()[0]  # the service manager, with any arguments
    with replaced(rule_file, f"{who} NOPASSWD: {tool}\n"):
        result = node_doctor(deployed, "ai001")
    assert result.returncode == 1, result.stdout + result.stderr
    (failure,) = failures(result)
    assert failure["name"].startswith("sudo-rule")
    assert f"{USER.name} may not run without a password: {command}" in failure["detail"]
    assert f"{USER.name} may also run: (root) NOPASSWD: {tool}" in failure["detail"]
    assert "sudoers.d/mlx-medic" in failure["fix"]


def test_a_node_without_its_config_is_named_by_its_doctor(deployed: Deployed) -> None:
    there = deployed.medic_config("ai002")
    with replaced(there, None):
        cannot_start = node_doctor(deployed, "ai002")
        from_elsewhere = node_doctor(deployed, "ai002", inventory=deployed.inventory)
    assert cannot_start.returncode == 2
    assert str(there) in cannot_start.stderr and "cannot read" in cannot_start.stderr
    assert from_elsewhere.returncode == 1, from_elsewhere.stdout + from_elsewhere.stderr
    (failure,) = failures(from_elsewhere)
    assert failure["name"].startswith("medic-config")
    assert failure["detail"] == f"{there} does not exist"
    assert failure["fix"] == f"copy {deployed.inventory} to {there} on every node"


# --- what only a call shows: the remediator's doctor, then a real remediate ------------


@dataclass(frozen=True)
class NodeFault:
    """A fault put on ai002 (not the head: the run's lock on the head still works), and
    what the doctor's failing check and the run's next action say of it."""

    check: str  # the doctor's check that fails on ai002
    detail: str
    fix: str


def faults(setup: Deployed) -> dict[str, tuple[Path, str | None, NodeFault]]:
    config = setup.medic_config("ai002")
    return {
        "its config missing at medic_config": (
            config,
            None,
            NodeFault(
                "facts tiny",
                f"mlx-medic on ai002 cannot read its inventory {config}: No such file or directory",
                f"put the inventory at {config} on ai002",
            ),
        ),
        "an older mlx-medic": (
            setup.medic_command("ai002"),
            OLDER_HELPER,
            NodeFault(
                "versions",
                f"ai002 runs mlx-medic {OLDER} (helper documents of schema {SCHEMA - 1}, not"
                f" {SCHEMA})",
                f"upgrade mlx-medic on ai002 to {version()} (nodes first, then the remediator)",
            ),
        ),
        "a forced command without the facts helper": (
            setup.medic_command("ai002"),
            WITHOUT_FACTS,
            NodeFault(
                "facts tiny",
                "ai002's forced command refused the call: mlx-medic forced command: refused",
                "render and install authorized-keys for ai002 again",
            ),
        ),
    }


@pytest.mark.parametrize(
    "fault",
    [
        "its config missing at medic_config",
        "an older mlx-medic",
        "a forced command without the facts helper",
    ],
)
def test_a_misdeployed_peer_is_named_by_the_doctor_and_a_real_run_ends_misconfigured(
    deployed: Deployed, fault: str
) -> None:
    path, text, expected = faults(deployed)[fault]
    serving = deployed.service_pid()
    journal = Journal(deployed.cluster.workdir / "journal.sqlite")
    with replaced(path, text):
        report = cluster_doctor(deployed)
        run = subprocess.run(
            [MEDIC, "remediate", MODEL, "--config.file", str(deployed.config)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    assert report.returncode == 1, report.stdout + report.stderr
    failed = failures(report)
    assert {check["node"] for check in failed} == {"ai002"}, failed
    named = next(check for check in failed if check["name"] == expected.check)
    assert expected.detail in named["detail"]
    assert expected.fix in named["fix"]

    assert run.returncode == EXIT_MISCONFIGURED, run.stdout + run.stderr
    latest = journal.list_runs(model=MODEL, limit=1)[0]
    assert latest.outcome == "misconfigured"
    assert expected.fix in " ".join(run.stdout.split()), run.stdout  # the doctor's fix
    assert deployed.service_pid() == serving  # the service untouched: the same process
    head_state = deployed.cluster.head.host_path(
        yaml.safe_load(deployed.inventory.read_text())["state_dir"]
    )
    assert read_service_stop(head_state, MODEL) is None  # no stop was ever asked
