"""Running a node helper the way the remediator does: `mlx-medic node HELPER ... --json`
in a process of its own, with the test's inventory and node."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_medic.command_line import version
from tests.node.inventories import two_models


@dataclass
class Helpers:
    config: Path
    state: Path

    def run(self, helper: str, *args: str, node: str = "n1") -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "node",
            helper,
            *args,
            "--inventory",
            str(self.config),
            "--node",
            node,
            "--json",
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def document(self, helper: str, *args: str, node: str = "n1", status: int = 0) -> Any:
        result = self.run(helper, *args, node=node)
        assert result.returncode == status, result.stderr
        document = json.loads(result.stdout)
        assert (document["schema"], document["version"], document["command"]) == (
            1,
            version(),
            helper,
        )
        return document


def two_model_helpers(tmp_path: Path, **extra: str) -> Helpers:
    """Helpers over tests.node.inventories.two_models with its state dir under tmp_path."""
    config = tmp_path / "inventory.yaml"
    config.write_text(two_models(str(tmp_path / "state"), **extra))
    return Helpers(config, tmp_path / "state")
