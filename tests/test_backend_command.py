"""`mlx-medic backend MODEL [auto|ring|jaccl]`: a person shows, pins or unpins the model's
backend; the choice lands on the model's head (here when this is the head, over SSH from
anywhere else), with who set it and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.state.backend_choice import read_backend_choice
from mlx_medic.state.node_identity import write_node_id
from testbed import Cluster
from tests.node.inventories import MEDIC, helper_inventory, two_models


def backend(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "backend", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def local_inventory(tmp_path: Path) -> Path:
    config = tmp_path / "inventory.yaml"
    node = f", medic_command: {MEDIC}, medic_config: {config}"
    config.write_text(two_models(str(tmp_path / "state"), n1=node))
    return config


def test_on_the_head_a_pin_is_recorded_here_with_who_and_why(tmp_path: Path) -> None:
    config = local_inventory(tmp_path)
    write_node_id(tmp_path / "state", "n1")  # this machine is n1, m1's head
    shown = backend("m1", "--inventory", str(config))
    assert shown.returncode == 0, shown.stderr
    assert (
        "m1: auto (JACCL first, then ring): no choice recorded; JACCL is tried first at"
        " every start while the ledger allows it (on n1)"
    ) in shown.stdout
    pinned = backend("m1", "ring", "--reason", "JACCL broken on ai003", "--inventory", str(config))
    assert pinned.returncode == 0, pinned.stderr
    assert "m1: pinned to ring, by " in pinned.stdout and "JACCL broken on ai003" in pinned.stdout
    assert (
        "JACCL is not tried again automatically (a person pinned ring): unpin with"
        " `mlx-medic backend m1 auto`"
    ) in pinned.stdout
    choice = read_backend_choice(tmp_path / "state", "m1")
    assert (choice.choice, choice.reason) == ("ring", "JACCL broken on ai003")
    assert choice.by.endswith("at a terminal")
    document = json.loads(backend("m1", "--json", "--inventory", str(config)).stdout)
    assert (document["choice"], document["pinned"]) == ("ring", True)
    assert backend("m1", "auto", "--inventory", str(config)).returncode == 0
    assert read_backend_choice(tmp_path / "state", "m1").choice == "auto"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("m9",), "no model 'm9'"),
        (("m1", "tcp"), "invalid choice: 'tcp'"),
    ],
)
def test_bad_input_is_refused_naming_it(tmp_path: Path, args: tuple[str, ...], why: str) -> None:
    result = backend(*args, "--inventory", str(local_inventory(tmp_path)), "--node", "n1")
    assert result.returncode == 2 and why in result.stderr


@pytest.mark.testbed
def test_off_the_cluster_the_choice_is_set_on_the_head_over_ssh(clean_cluster: Cluster) -> None:
    cluster = clean_cluster
    config = helper_inventory(
        cluster,
        [
            {
                "name": "tiny",
                "model": "/models/tiny",
                "nodes": ["ai001", "ai002"],
                "port": 18083,
                "service": {"manager": "supervisord", "label": "tiny"},
                "backends": {"ring": {"hostfile": str(cluster.workdir / "ring.json")}},
            }
        ],
        "backend",
    )
    result = backend("tiny", "ring", "--reason", "pin over ssh", "--inventory", str(config))
    assert result.returncode == 0, result.stderr
    assert "(on ai001)" in result.stdout
    assert read_backend_choice(cluster.head.state_dir, "tiny").choice == "ring"  # on the head
    shown = backend("tiny", "--json", "--inventory", str(config))
    assert json.loads(shown.stdout)["reason"] == "pin over ssh"
