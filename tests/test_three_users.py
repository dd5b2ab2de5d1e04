"""The three-user mode of the testbed, as deployed: each node's login user exists only
inside the node's own mount namespace, owns the node's state dir, reaches its peers with
its own key (what mlx.launch needs), and the remediator's and the serve wrapper's keys get
in only through the `authorized_keys` that `mlx-medic render` wrote, limited to the
helpers each key's arm sends; `sudo -n -l` lists exactly the rendered rule."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from testbed import Cluster, free_port, processes, start_cluster
from testbed.node_users import NodeUser
from tests.tools import require_root, require_tool

pytestmark = [pytest.mark.testbed]

USER = NodeUser()
MEDIC = str(Path(sys.executable).parent / "mlx-medic")


@pytest.fixture(scope="module")
def users_cluster(testbed_workdir: Path) -> Iterator[Cluster]:
    """Two nodes in the three-user mode, whatever mode the session's cluster is in."""
    require_root()
    for tool in ("sshd", "ssh", "unshare", "nsenter", "mount", "sudo", "visudo", "setpriv"):
        require_tool(tool)
    started = start_cluster(2, testbed_workdir / f"users-{uuid.uuid4().hex[:6]}", node_user=USER)
    try:
        yield started
    finally:
        started.close()


def as_user(
    cluster: Cluster, node: str, command: str, identity: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.node(node).user_ssh_argv(command, identity=identity),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_inventory(
    cluster: Cluster, models: list[dict], reboot: dict[str, dict] | None = None
) -> Path:
    """The inventory in the cluster's workdir (every node reads it there, as its own
    /etc/mlx-medic/inventory.yaml); `reboot`: nodes' `reboot` sections."""
    path = cluster.workdir / f"inventory-{uuid.uuid4().hex[:8]}.yaml"
    data = yaml.safe_load(cluster.inventory_yaml(models, login_user=USER.name))
    data["ssh"]["identity_file"] = str(cluster.remediator_identity)
    data["ssh"]["remediator_addresses"] = ["127.0.0.1"]
    for node in data["nodes"].values():
        node.update({"medic_command": MEDIC, "medic_config": str(path)})
    for name, section in (reboot or {}).items():
        data["nodes"][name]["reboot"] = section
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_login_user_exists_only_inside_the_nodes(users_cluster: Cluster):
    assert USER.name not in Path("/etc/passwd").read_text().split(":")
    for node in users_cluster.nodes:
        seen = as_user(users_cluster, node.name, "id -un; id -u; echo $HOME")
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == [USER.name, str(USER.uid), str(USER.home)]
        assert node.state_dir.stat().st_uid == USER.uid  # the node user's, as deployed


def test_the_login_user_runs_this_python_and_reaches_its_peer_with_its_own_key(
    users_cluster: Cluster,
):
    """What mlx.launch does as the service user: plain `ssh PEER` (the testbed's ssh on
    PATH), and the interpreter the ranks run."""
    ssh = users_cluster.bin_dir / "ssh"
    peer = as_user(users_cluster, "ai001", f"{ssh} ai002 id -un")
    assert (peer.returncode, peer.stdout.strip()) == (0, USER.name), peer.stderr
    python = as_user(users_cluster, "ai001", f"{sys.executable} -c 'import mlx, mlx_medic'")
    assert python.returncode == 0, python.stderr


def test_the_remediators_key_gets_in_only_through_the_rendered_file(
    users_cluster: Cluster,
):
    for node in users_cluster.nodes:
        (node.root / "home" / USER.name / ".ssh" / "authorized_keys").write_text("")
    refused = as_user(users_cluster, "ai002", "id", identity=users_cluster.remediator_identity)
    assert refused.returncode == 255  # no line for it: sshd refuses the key
    hostfile = users_cluster.hostfile(users_cluster.workdir / "ring.json", ["ai001", "ai002"])
    inventory = write_inventory(
        users_cluster,
        [
            {
                "name": "tiny",
                "model": "m",
                "nodes": ["ai001", "ai002"],
                "port": free_port(),
                "service": {"manager": "supervisord", "label": "tiny"},
                "backends": {"ring": {"hostfile": str(hostfile)}},
            }
        ],
    )
    rendered = users_cluster.deploy(inventory)
    assert rendered is not None
    line = (rendered / "authorized-keys" / "ai002" / "authorized_keys").read_text()
    assert "restrict" in line and "no-user-rc" in line and 'from="127.0.0.1"' in line
    shell = as_user(users_cluster, "ai002", "id", identity=users_cluster.remediator_identity)
    assert shell.returncode == 2 and "refused" in shell.stderr  # the forced command's answer
    facts = as_user(
        users_cluster,
        "ai002",
        f"{MEDIC} node facts tiny --inventory {inventory}",
        identity=users_cluster.remediator_identity,
    )
    assert facts.returncode == 0, facts.stderr


def test_sudo_lists_exactly_the_rendered_rules_on_the_head_and_only_the_reboot_on_the_peer(
    users_cluster: Cluster,
):
    """The head: its service's three commands. The peer heads nothing: with
    `reboot.allowed` it gets the one reboot command, and no other."""
    conf = users_cluster.workdir / "supervisord-sudo.conf"
    hostfile = users_cluster.hostfile(users_cluster.workdir / "ring.json", ["ai001", "ai002"])
    inventory = write_inventory(
        users_cluster,
        [
            {
                "name": "tiny",
                "model": "m",
                "nodes": ["ai001", "ai002"],
                "port": free_port(),
                "service": {
                    "manager": "supervisord",
                    "label": "tiny-sudo",
                    "config": str(conf),
                    "sudo": True,
                },
                "backends": {"ring": {"hostfile": str(hostfile)}},
            }
        ],
        reboot={"ai002": {"allowed": True, "command": ["/sbin/shutdown", "-r", "now"]}},
    )
    rendered = users_cluster.deploy(inventory)
    assert rendered is not None

    def rules(node: str) -> list[str]:
        text = (rendered / "sudoers" / node / "mlx-medic").read_text()
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    def listed(node: str) -> list[str]:
        seen = as_user(users_cluster, node, "sudo -n -l")
        assert seen.returncode == 0, seen.stderr
        return [line.strip() for line in seen.stdout.splitlines() if line.strip()[:6] == "(root)"]

    assert len(rules("ai001")) == 3  # stop, start, restart
    assert listed("ai001") == [rule.split("ALL=", 1)[1] for rule in rules("ai001")]
    assert listed("ai002") == ["(root) NOPASSWD: /sbin/shutdown -r now"]
    assert as_user(users_cluster, "ai001", "sudo -n /bin/true").returncode != 0
    assert as_user(users_cluster, "ai002", "sudo -n -l /sbin/reboot").returncode != 0


def test_the_serve_wrapper_runs_as_the_node_user_falls_back_to_ring_and_comes_back(
    users_cluster: Cluster,
    tiny_model: Path,
):
    """Under supervisord as the rendered user, with the serve key limited to its table:
    JACCL fails (Linux), ring serves across both nodes; after the seed's crash it serves
    again, and every rank is the node user's."""
    from tests.serve.scenario import prepare, supervised

    require_tool("supervisord")
    served = prepare(users_cluster, tiny_model)
    try:
        with supervised(served):
            first = served.wait_serving()
            assert first.backend == "ring"
            ranks = served.ranks("ai001") + served.ranks("ai002")
            assert ranks and all(psutil.Process(pid).uids().real == USER.uid for pid in ranks)
            for pid in served.launchers():
                processes.kill_quietly(pid)
            for pid in served.ranks("ai001"):
                processes.kill_quietly(pid)
            again = served.wait_serving(run_id=first.run_id)
            assert again.state == "serving" and served.ranks("ai002")
    finally:
        served.close()
        for node in users_cluster.nodes:
            node.kill_all_but_sshd()


def test_nothing_of_the_mode_is_left_on_this_machine(users_cluster: Cluster):
    assert not Path("/etc/sudoers.d/mlx-medic").exists()
    assert USER.name not in Path("/etc/group").read_text().split(":")
    assert shutil.which("visudo") is not None
