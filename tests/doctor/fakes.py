"""A node for the doctor's tests: an inventory, a machine that answers commands with
verbatim outputs (tests/fixtures/) and records them, processes and sockets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlx_medic.doctor.framework import DoctorContext
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.platform.commands import CommandNotFound, CompletedCommand
from tests.exporter.macos_commands import FIXTURES, macos_output, ok

SUDO_FIXTURES = FIXTURES.parent / "sudo"
MEDIC = "/opt/mlx-medic/bin/mlx-medic"
PYTHON = "/opt/mlx/bin/python3"

__all__ = ["MEDIC", "PYTHON", "Machine", "context", "fixture_output", "inventory", "ok"]


def fixture_output(name: str) -> str:
    """A fixture's output without its `#` source header (tests/fixtures/macos or sudo)."""
    if (FIXTURES / name).exists():
        return macos_output(name)
    lines = (SUDO_FIXTURES / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source:"), f"{name} must name its source"
    return "".join(line for line in lines if not line.startswith("#"))


Answer = CompletedCommand | Exception


@dataclass
class Machine:
    """Answers each argv (or each (user, argv): the command run as that user); a tool it
    has no answer for is not installed. Records every call as (user, argv)."""

    answers: dict[Any, Answer] = field(default_factory=dict)
    calls: list[tuple[str | None, tuple[str, ...]]] = field(default_factory=list)

    def run_as(self, user: str | None) -> Callable[[Sequence[str], float], CompletedCommand]:
        def run(argv: Sequence[str], timeout: float) -> CompletedCommand:
            key = tuple(argv)
            self.calls.append((user, key))
            answer = self.answers.get((user, key), self.answers.get(key))
            if answer is None:
                answer = CommandNotFound(f"{key[0]} is not installed on this host")
            if isinstance(answer, Exception):
                raise answer
            return answer

        return run


def inventory(path: Path, **model: Any) -> Inventory:
    """Head ai001 and peer ai002 (login user `ai`), model glm on both: launchd, with
    `model`'s keys over the defaults."""
    glm: dict[str, Any] = {
        "model": "mlx-community/GLM-4.6-5bit",
        "nodes": ["ai001", "ai002"],
        "port": 8080,
        "service": {
            "manager": "launchd",
            "label": "otelcol-sumo",
            "plist": "/Library/LaunchDaemons/com.sumologic.otelcol-sumo.plist",
            "user": "_otelcol-sumo",
            "kind": "script",
        },
        "backends": {"jaccl": {"hostfile": "/etc/mlx/jaccl.json"}},
        "serve": {"python": PYTHON},
    }
    glm.update(model)
    data = {
        "state_dir": str(path.parent / "state"),
        "ssh": {"user": "ai", "remediator_addresses": ["10.0.0.5"]},
        "nodes": {
            "ai001": {"ssh": "10.0.0.11", "medic_command": MEDIC},
            "ai002": {"ssh": "10.0.0.12", "medic_command": MEDIC},
        },
        "models": {"glm": glm},
    }
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


def context(
    machine: Machine | None = None,
    *,
    platform: str = "darwin",
    user: str = "root",
    inventory_path: Path | None = None,
    node: str = "ai001",
    **seams: Any,
) -> DoctorContext:
    """A doctor on `node` of the inventory at `inventory_path` (none: no inventory)."""
    loaded = load_inventory(inventory_path) if inventory_path else None
    seams.setdefault("process_iter", lambda attrs=None: [])
    seams.setdefault("listening", lambda: lambda pid, port: False)
    seams.setdefault("is_dir", lambda path: True)
    return DoctorContext(
        platform=platform,
        user=user,
        inventory=loaded,
        inventory_path=inventory_path,
        node=loaded.node(node) if loaded else None,
        run_as=(machine or Machine()).run_as,
        **seams,
    )
