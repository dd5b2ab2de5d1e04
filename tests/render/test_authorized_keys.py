"""The remediator's key in each node's authorized_keys, pinned to the node helpers: the
line's form, the key checked before anything is written, and a real sshd (the testbed)
that runs an allowed helper with it and refuses a shell."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from mlx_medic.inventory import load_inventory
from mlx_medic.node.forced_command import EXIT_REFUSED
from testbed import Cluster
from tests.render.helpers import EXAMPLE, EXAMPLE_KEY, render, render_example, write_inventory

RESTRICTIONS = "no-pty,no-port-forwarding,no-agent-forwarding,no-X11-forwarding"


def key_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_every_node_gets_one_line_forcing_its_own_helpers_command(tmp_path: Path):
    out = render_example("authorized-keys", tmp_path) / "authorized-keys"
    key = EXAMPLE_KEY.read_text().strip()
    for node in load_inventory(EXAMPLE).nodes:
        path = out / node.name / "authorized_keys"
        assert key_lines(path) == [
            f'command="{node.medic_command} node forced-command --config.file'
            f' {node.medic_config}",{RESTRICTIONS} {key}']
        assert path.stat().st_mode & 0o777 == 0o600


def test_the_key_defaults_to_the_inventorys_identity_file_with_pub(tmp_path: Path):
    public = tmp_path / "id_ed25519.pub"
    public.write_text(EXAMPLE_KEY.read_text())
    inventory = write_inventory(tmp_path / "inv.yaml", {"n1": {
        "ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}}, {})
    data = yaml.safe_load(inventory.read_text())
    data["ssh"] = {"identity_file": str(tmp_path / "id_ed25519")}
    inventory.write_text(yaml.safe_dump(data))
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == 0, err
    assert EXAMPLE_KEY.read_text().split()[1] in (
        tmp_path / "out" / "authorized-keys" / "n1" / "authorized_keys").read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ssh-ed25519 not-base64!", "not valid base64"),
        ("ssh-rsa " + EXAMPLE_KEY.read_text().split()[1], "says 'ssh-rsa' but its data is"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
         "-----END OPENSSH PRIVATE KEY-----", "not one public key line"),
    ],
)
def test_anything_but_one_public_key_is_refused_before_writing(tmp_path: Path, text, message):
    key = tmp_path / "key.pub"
    key.write_text(text + "\n")
    code, _, err = render("authorized-keys", EXAMPLE, tmp_path / "out", "--ssh.public-key",
                          str(key))
    assert code == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_without_a_key_the_target_says_which_flag_gives_it(tmp_path: Path):
    inventory = write_inventory(tmp_path / "inv.yaml", {"n1": {
        "ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}}, {})
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == 1 and "--ssh.public-key" in err


def test_sshd_runs_an_allowed_helper_with_the_rendered_line_and_refuses_a_shell(
    cluster: Cluster, tmp_path: Path
):
    """The rendered line, as it is, in a testbed node's authorized_keys; the node's
    medic_command is this checkout's console script, its medic_config the inventory."""
    token = uuid.uuid4().hex[:8]
    node = cluster.node("ai002")
    inventory_path = cluster.workdir / f"render-keys-{token}.yaml"
    data = yaml.safe_load(cluster.inventory_yaml([]))
    for entry in data["nodes"].values():
        entry["medic_command"] = str(Path(sys.executable).parent / "mlx-medic")
        entry["medic_config"] = str(inventory_path)
    inventory_path.write_text(yaml.safe_dump(data))
    key = tmp_path / f"remediator-{token}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", token, "-f", str(key)],
                   check=True, capture_output=True)
    code, _, err = render("authorized-keys", inventory_path, tmp_path / "out",
                          "--ssh.public-key", f"{key}.pub")
    assert code == 0, err
    node.authorized_keys.write_text(
        (tmp_path / "out" / "authorized-keys" / node.name / "authorized_keys").read_text())

    def ssh(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(node.ssh_argv(command, identity=key), capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    try:
        allowed = ssh("mlx-medic node ledger --json")
        assert allowed.returncode == 0, allowed.stderr
        assert json.loads(allowed.stdout)["node"] == node.name
        refused = ssh("sh -c id")
        assert refused.returncode == EXIT_REFUSED and refused.stdout == ""
        assert "refused" in refused.stderr
    finally:
        node.remove_forced_key()
        inventory_path.unlink(missing_ok=True)
