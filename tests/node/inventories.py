"""The inventory the node-helper tests share: nodes n1 and n2, model m1 on both, m2 on n2."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

MEDIC = str(Path(sys.executable).with_name("mlx-medic"))  # this venv's console script
CHECKOUT = Path(__file__).resolve().parents[2]  # the code under test


def checkout_shim(path: Path, program: str) -> Path:
    """`program` with this checkout first on PYTHONPATH (written to `path`).

    Why: sshd starts a node's session with a clean environment, where the venv's console
    script imports the checkout it was installed from, which need not be this one (a git
    worktree's tests would run another checkout's node helpers and ranks)."""
    path.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={CHECKOUT}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f'exec {program} "$@"\n'
    )
    path.chmod(0o755)
    return path


def checkout_medic(directory: Path) -> Path:
    """A node's mlx-medic that runs this checkout's code (written to `directory`)."""
    return checkout_shim(directory / "checkout-mlx-medic", MEDIC)


def two_models(
    state_dir: str = "/var/lib/mlx-medic", *, n1: str = "", m1: str = "", m2: str = ""
) -> str:
    """The YAML; `n1`, `m1`, `m2`: extra lines (already indented) for that entry."""
    return f"""\
state_dir: {state_dir}
nodes:
  n1: {{ssh: 127.0.0.2{n1}}}
  n2: {{ssh: 127.0.0.3}}
models:
  m1:
    model: /models/m1
    nodes: [n1, n2]
    port: 8080
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}{m1}
  m2:
    model: /models/m2
    nodes: [n2]
    port: 8081
    service: {{manager: supervisord, label: m2}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}{m2}
"""


def helper_inventory(cluster: Any, models: list[dict[str, Any]], name: str) -> Path:
    """The testbed's inventory for `models`, written under its workdir (every node sees it),
    with every node running this venv's mlx-medic with it: the node helpers the lock, the
    remediator and the serve wrapper call over SSH run there for real."""
    path = cluster.workdir / f"{name}-{uuid.uuid4().hex[:8]}.yaml"
    data = yaml.safe_load(cluster.inventory_yaml(models))
    for node in data["nodes"].values():
        node |= {"medic_command": MEDIC, "medic_config": str(path)}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
