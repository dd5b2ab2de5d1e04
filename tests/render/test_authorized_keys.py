"""The keys in each node's authorized_keys, each pinned to the forced command with its
own table and to where it logs in from: the line's form (`restrict,no-user-rc,from=,
command=... --key`), the remediator's key on every node and the serve wrappers' keys on
their models' other nodes, the keys checked before anything is written, and a real sshd
(the testbed) that runs an allowed helper with the rendered line and refuses a shell."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.inventory.load import load_inventory
from mlx_medic.node.forced_command import EXIT_REFUSED
from testbed import Cluster
from testbed.cluster import SSH
from tests.render.helpers import EXAMPLE, EXAMPLE_KEY, render, render_example, write_inventory

EXAMPLE_FROM = "192.168.101.10,192.168.101.11"  # the example's ssh.remediator_addresses


def key_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def public_key(seed: int, comment: str) -> str:
    """An ed25519 public key line (its 32 bytes made up: only the form is checked)."""
    blob = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes([seed] * 32)
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


def line(
    key: str,
    addresses: str,
    command: str = "/opt/m/bin/mlx-medic",
    config: str = "/etc/mlx-medic/inventory.yaml",
    which: str = "remediator",
) -> str:
    return (
        f'restrict,no-user-rc,from="{addresses}",command="{command} node forced-command'
        f' --inventory {config} --key {which}" {key}'
    )


def test_every_node_gets_the_remediators_key_pinned_to_its_table_and_addresses(
    tmp_path: Path,
):
    out = render_example("authorized-keys", tmp_path) / "authorized-keys"
    key = EXAMPLE_KEY.read_text().strip()
    for node in load_inventory(EXAMPLE).nodes:
        path = out / node.name / "authorized_keys"
        assert key_lines(path) == [
            line(key, EXAMPLE_FROM, node.medic_command, str(node.medic_config))
        ]
        assert f"for ~{node.user}/.ssh/authorized_keys" in path.read_text()
        assert path.stat().st_mode & 0o777 == 0o600


def keyed_inventory(tmp_path: Path, models: dict[str, Any], **ssh: Any) -> Path:
    """Nodes n1..n4 (n1 and n4 heads), the remediator's key beside its identity file."""
    (tmp_path / "remediator.pub").write_text(public_key(1, "remediator") + "\n")
    nodes = {
        f"n{i}": {"ssh": f"10.0.0.{i}", "medic_command": "/opt/m/bin/mlx-medic"}
        for i in range(1, 5)
    }
    path = write_inventory(tmp_path / "inv.yaml", nodes, models)
    data = yaml.safe_load(path.read_text())
    data["ssh"] = {
        "identity_file": str(tmp_path / "remediator"),
        "remediator_addresses": ["10.9.0.1", "10.9.1.0/24"],
        **ssh,
    }
    path.write_text(yaml.safe_dump(data))
    return path


def served(nodes: list[str], port: int, identity: Path | None) -> dict[str, Any]:
    return {
        "model": "/models/m",
        "nodes": nodes,
        "port": port,
        "service": {"manager": "supervisord", "label": f"m{port}"},
        "backends": {"ring": {"hostfile": "/etc/ring.json"}},
        "serve": {"identity_file": str(identity) if identity else None},
    }


def test_a_models_other_nodes_get_its_wrappers_key_from_its_head_one_line_per_key(
    tmp_path: Path,
):
    shared, own = tmp_path / "serve_a", tmp_path / "serve_b"
    for seed, path in ((2, shared), (3, own)):
        Path(f"{path}.pub").write_text(public_key(seed, path.name) + "\n")
    inventory = keyed_inventory(
        tmp_path,
        {
            "a": served(["n1", "n2", "n3"], 8080, shared),
            "b": served(["n4", "n3"], 8081, shared),  # n3 is a peer of both: one line, two heads
            "c": served(["n4", "n2"], 8082, own),  # another key: a line of its own
            "d": served(["n1", "n4"], 8083, None),  # default keys: no line the render can write
        },
    )
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == 0, err
    remediator = line(public_key(1, "remediator"), "10.9.0.1,10.9.1.0/24")
    serve_a, serve_b = public_key(2, "serve_a"), public_key(3, "serve_b")
    lines = {
        node: key_lines(tmp_path / "out" / "authorized-keys" / node / "authorized_keys")
        for node in ("n1", "n2", "n3", "n4")
    }
    assert lines == {
        "n1": [remediator],  # a head only: its wrapper reaches it without SSH
        "n2": [
            remediator,
            line(serve_a, "10.0.0.1", which="serve"),
            line(serve_b, "10.0.0.4", which="serve"),
        ],
        "n3": [remediator, line(serve_a, "10.0.0.1,10.0.0.4", which="serve")],
        "n4": [remediator],
    }


def test_a_head_that_logs_in_from_other_addresses_names_them(tmp_path: Path):
    key = tmp_path / "serve"
    Path(f"{key}.pub").write_text(public_key(2, "serve") + "\n")
    inventory = keyed_inventory(tmp_path, {"a": served(["n1", "n2"], 8080, key)})
    data = yaml.safe_load(inventory.read_text())
    data["nodes"]["n1"]["source_addresses"] = ["10.1.0.1", "10.2.0.0/16"]  # multi-homed
    inventory.write_text(yaml.safe_dump(data))
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == 0, err
    n2 = key_lines(tmp_path / "out" / "authorized-keys" / "n2" / "authorized_keys")
    assert n2[1] == line(public_key(2, "serve"), "10.1.0.1,10.2.0.0/16", which="serve")


def test_one_serve_public_key_flag_is_every_wrappers_key(tmp_path: Path):
    flag = tmp_path / "wrapper.pub"
    flag.write_text(public_key(4, "wrapper") + "\n")
    inventory = keyed_inventory(tmp_path, {"a": served(["n1", "n2"], 8080, tmp_path / "none")})
    code, _, err = render(
        "authorized-keys", inventory, tmp_path / "out", "--serve.public-key", str(flag)
    )
    assert code == 0, err
    n2 = key_lines(tmp_path / "out" / "authorized-keys" / "n2" / "authorized_keys")
    assert n2[1] == line(public_key(4, "wrapper"), "10.0.0.1", which="serve")


@pytest.mark.parametrize(
    ("models", "flags", "message"),
    [
        ({}, ["--serve.public-key", "/nonexistent.pub"], "no model sets serve.identity_file"),
        (
            {"a": served(["n1", "n2"], 8080, Path("/nonexistent"))},
            [],
            "missing settings: --serve.public-key FILE (for authorized-keys:"
            " models.a.serve.identity_file's .pub /nonexistent.pub cannot be read",
        ),
        (
            {"a": served(["n1", "n2"], 8080, Path("/nonexistent"))},
            ["--serve.public-key", "REMEDIATOR"],
            "the serve wrapper's key is the remediator's",
        ),
    ],
)
def test_a_serve_key_that_cannot_be_read_or_is_the_remediators_is_refused(
    tmp_path: Path, models: dict[str, Any], flags: list[str], message: str
):
    inventory = keyed_inventory(tmp_path, models)
    flags = [str(tmp_path / "remediator.pub") if f == "REMEDIATOR" else f for f in flags]
    code, _, err = render("authorized-keys", inventory, tmp_path / "out", *flags)
    assert code == EXIT_USAGE and message in err
    assert not (tmp_path / "out").exists()


def test_without_the_remediators_addresses_no_line_is_written(tmp_path: Path):
    inventory = keyed_inventory(tmp_path, {}, remediator_addresses=[])
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == EXIT_USAGE
    assert "missing settings: ssh.remediator_addresses in the inventory" in err
    assert "without from= could be used from anywhere" in err
    assert not (tmp_path / "out").exists()


def test_the_key_defaults_to_the_inventorys_identity_file_with_pub(tmp_path: Path):
    public = tmp_path / "id_ed25519.pub"
    public.write_text(EXAMPLE_KEY.read_text())
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}},
        {},
    )
    data = yaml.safe_load(inventory.read_text())
    data["ssh"] = {
        "identity_file": str(tmp_path / "id_ed25519"),
        "remediator_addresses": ["10.9.0.1"],
    }
    inventory.write_text(yaml.safe_dump(data))
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == 0, err
    assert (
        EXAMPLE_KEY.read_text().split()[1]
        in (tmp_path / "out" / "authorized-keys" / "n1" / "authorized_keys").read_text()
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ssh-ed25519 not-base64!", "not valid base64"),
        ("ssh-rsa " + EXAMPLE_KEY.read_text().split()[1], "says 'ssh-rsa' but its data is"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
            "-----END OPENSSH PRIVATE KEY-----",
            "not one public key line",
        ),
    ],
)
def test_anything_but_one_public_key_is_refused_before_writing(tmp_path: Path, text, message):
    key = tmp_path / "key.pub"
    key.write_text(text + "\n")
    code, _, err = render(
        "authorized-keys", EXAMPLE, tmp_path / "out", "--ssh.public-key", str(key)
    )
    assert code == EXIT_USAGE and message in err
    assert not (tmp_path / "out").exists()


def test_without_a_key_the_target_says_which_flag_gives_it(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}},
        {},
    )
    code, _, err = render("authorized-keys", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "--ssh.public-key" in err


def test_sshd_runs_an_allowed_helper_with_the_rendered_line_from_its_addresses_only(
    cluster: Cluster, tmp_path: Path
):
    """The rendered line, as it is, in a testbed node's authorized_keys; the node's
    medic_command is this checkout's console script, its medic_config the inventory. From
    an address the line does not name, sshd does not accept the key at all."""
    token = uuid.uuid4().hex[:8]
    node = cluster.node("ai002")
    inventory_path = cluster.workdir / f"render-keys-{token}.yaml"
    key = tmp_path / f"remediator-{token}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", token, "-f", str(key)],
        check=True,
        capture_output=True,
    )

    def install(addresses: list[str]) -> None:
        data = yaml.safe_load(cluster.inventory_yaml([]))
        data["ssh"]["remediator_addresses"] = addresses
        for entry in data["nodes"].values():
            entry["medic_command"] = str(Path(sys.executable).parent / "mlx-medic")
            entry["medic_config"] = str(inventory_path)
        inventory_path.write_text(yaml.safe_dump(data))
        code, _, err = render(
            "authorized-keys", inventory_path, tmp_path / "out", "--ssh.public-key", f"{key}.pub"
        )
        assert code == 0, err
        node.authorized_keys.write_text(
            (tmp_path / "out" / "authorized-keys" / node.name / "authorized_keys").read_text()
        )

    def ssh(command: str) -> subprocess.CompletedProcess[str]:
        argv = [
            SSH,
            "-F",
            "/dev/null",
            "-i",
            str(key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={cluster.known_hosts}",
            "-o",
            "BatchMode=yes",
            "-p",
            str(node.ssh_port),
            f"root@{node.address}",
            command,
        ]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )

    try:
        install(["127.0.0.0/8"])  # the testbed's clients: this machine's loopback
        allowed = ssh("mlx-medic node pid-alive 1 --json")  # the node's own pid 1
        assert allowed.returncode == 0, allowed.stderr
        assert json.loads(allowed.stdout)["liveness"] == "alive"
        refused = ssh("sh -c id")
        assert refused.returncode == EXIT_REFUSED and refused.stdout == ""
        assert "refused" in refused.stderr
        install(["10.255.0.1"])
        elsewhere = ssh("mlx-medic node pid-alive 1 --json")
        assert elsewhere.returncode == 255 and "Permission denied" in elsewhere.stderr
    finally:
        node.remove_forced_key()
        inventory_path.unlink(missing_ok=True)
