"""Where a model's server is probed on its own node: one mapping (health.probe_host) for
every prober, so the sweep, the exporter and the remediator's remote probe (the `node
probe` helper) name the same target, take the same probe lock file, and the remote probe
passes the forced command's check."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from mlx_medic import health
from mlx_medic.exporter.collector import ExporterContext
from mlx_medic.exporter.collectors.service import targets_for
from mlx_medic.health import ProbeResult, _lock_file_name, probe_host
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.node import probe_cli
from mlx_medic.node.cli import helper_document
from mlx_medic.node.forced_command import Allowed, validate
from mlx_medic.node.sweep import answers_health_probe
from mlx_medic.remediator.model_health import probe_model_health
from mlx_medic.transport.interface import CommandResult
from tests.node.inventories import two_models

WILDCARDS = ["0.0.0.0", "", "::"]


@pytest.mark.parametrize(
    ("listen", "probed"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("::", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("192.168.101.1", "192.168.101.1"),
        ("::1", "::1"),
    ],
)
def test_a_wildcard_listen_address_is_probed_on_loopback_of_its_family(
    listen: str, probed: str
) -> None:
    assert probe_host(listen) == probed


def _inventory_text(host: str, state_dir: Path | str = "/var/lib/mlx-medic") -> str:
    return two_models(
        str(state_dir),
        n1=", medic_command: /opt/mlx-medic/bin/mlx-medic",
        m1=f"\n    host: {host!r}",
    )


def _inventory(host: str, state_dir: Path | str = "/var/lib/mlx-medic") -> Any:
    return parse_inventory(_inventory_text(host, state_dir))


@pytest.mark.parametrize("listen", WILDCARDS)
def test_the_sweep_the_probe_helper_and_the_exporter_probe_one_target_under_one_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], listen: str
) -> None:
    inventory = _inventory(listen, tmp_path)
    config = tmp_path / "inventory.yaml"
    config.write_text(_inventory_text(listen, tmp_path))
    probed: list[tuple[str, int]] = []

    def fake_probe(host: str, port: int, **_: Any) -> ProbeResult:
        probed.append((host, port))
        return ProbeResult(True, "completed", 0.0)

    monkeypatch.setattr(health, "probe_model", fake_probe)
    monkeypatch.setattr(probe_cli, "probe_model", fake_probe)
    answers_health_probe(inventory.model("m1"), tmp_path)
    helper = argparse.Namespace(
        model="m1", timeout=1.0, inventory=config, state_dir=None, node="n1", json=True
    )
    assert probe_cli.run(helper) == 0
    [target] = targets_for(ExporterContext(node="n1", inventory=inventory, state_dir=tmp_path))
    assert probed == [(target.host, target.port)] * 2
    assert _lock_file_name(*probed[0]) == _lock_file_name(target.host, target.port)


class _Recording:
    def __init__(self) -> None:
        self.argv: list[str] = []

    async def run(self, node: Any, argv: list[str], *, timeout: float) -> CommandResult:
        self.argv = list(argv)
        verdict = {"up": True, "conclusive": True, "reason": "completed", "latency_seconds": 0.1}
        return CommandResult(0, json.dumps(helper_document("probe", verdict)), "")


@pytest.mark.parametrize("listen", WILDCARDS)
async def test_the_probe_the_remediator_sends_to_the_head_passes_its_forced_command(
    listen: str,
) -> None:
    inventory = _inventory(listen)
    transport = _Recording()
    verdict = await probe_model_health(
        inventory.model("m1"),
        inventory,
        transport=transport,  # type: ignore[arg-type]
        probe_from="head",
    )
    assert verdict.reason == "on n1: completed"
    allowed = Allowed(inventory, Path("/etc/mlx-medic/inventory.yaml"), "n1")
    assert validate(shlex.join(transport.argv), allowed)[:3] == ["node", "probe", "m1"]
