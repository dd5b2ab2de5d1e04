"""Rendering for the tests: the CLI in-process, the example inventory's flags, and small
inventories for what the example does not have (Linux services)."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mlx_medic.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "inventory.yaml"
EXAMPLE_KEY = REPO / "examples" / "remediator_ed25519.pub"
SITE_FLAGS = [
    "--remediator.url",
    "https://remediator.example:10901",
    "--alertmanager.address",
    "alertmanager.example:9093",
]


def render(target: str, inventory: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    """`mlx-medic render TARGET`: (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["render", target, "--inventory", str(inventory), "--out", str(out), *flags])
    return code, stdout.getvalue(), stderr.getvalue()


def render_ok(target: str, inventory: Path, out: Path, *flags: str) -> Path:
    code, _, err = render(target, inventory, out, *flags)
    assert code == 0, err
    return out


def render_example(target: str, out: Path, *flags: str) -> Path:
    return render_ok(
        target, EXAMPLE, out, *SITE_FLAGS, "--ssh.public-key", str(EXAMPLE_KEY), *flags
    )


def write_inventory(
    path: Path, nodes: dict[str, Any], models: dict[str, Any], **sections: Any
) -> Path:
    path.write_text(yaml.safe_dump({"nodes": nodes, "models": models, **sections}))
    return path


# What `render all` needs beyond the inventory's nodes and models.
ALL_SSH = {"remediator_addresses": ["10.9.0.1"]}  # the inventory's ssh section
ALL_FLAGS = [*SITE_FLAGS, "--ssh.public-key", str(EXAMPLE_KEY)]


def model(
    manager: str, label: str, node: str = "n1", port: int = 8080, **extra: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "/models/m",
        "nodes": [node],
        "port": port,
        "service": {"manager": manager, "label": label, "user": "mlxsvc"},
        "backends": {"ring": {"hostfile": "/etc/mlx/ring.json"}},
        "tmp_dirs": ["/var/tmp/mlx-share/m"],
        "log_files": ["/var/log/mlx/m.err.log", "/var/log/mlx/m.out.log"],
    }
    data.update(extra)
    return data


def run(*argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=120, check=False, **kwargs
    )
