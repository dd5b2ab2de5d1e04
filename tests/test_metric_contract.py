"""The metric contract (alerting-rules/metrics.txt): every name the rules and
dashboards rely on is really exported, under that exact name, by its one owner: the
exporter serves what a node records (each series naming its node), the remediator only
what it decides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.transport import LocalTransport
from tests.promql_names import contract_sections

REPO = Path(__file__).resolve().parents[1]
CONTRACT = [name for names in contract_sections().values() for name in names]
REMEDIATOR_NAMES = contract_sections()["remediator"]
EXPORTER_NAMES = contract_sections()["exporter"]
RDMA_NAMES = {"mlx_rdma_port_active", "mlx_rdma_objects"}  # macOS only: absent here


def inventory_text(tmp_path: Path, port: int = 1) -> str:
    for sub in ("tmp", "state"):
        (tmp_path / sub).mkdir(exist_ok=True)
    log = tmp_path / "m1.log"
    log.write_text("RuntimeError: [jaccl] Couldn't allocate protection domain\n")
    return f"""\
state_dir: {tmp_path / "state"}
launch_temp_dirs: [{tmp_path / "tmp"}]
nodes:
  n1: {{ssh: 127.0.0.1}}
models:
  m1:
    model: /models/m1
    nodes: [n1]
    port: {port}
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json, pipeline: true}}}}
    tmp_dirs: [{tmp_path / "tmp"}]
    log_files: [{log}]
"""


def exported_names(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


def scrape_once(tmp_path: Path) -> str:
    config = tmp_path / "inventory.yaml"
    config.write_text(inventory_text(tmp_path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--once",
            "--inventory",
            str(config),
            "--node",
            "n1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_exporter_exports_every_contract_name_but_the_macos_only_rdma_ones(
    tmp_path: Path,
) -> None:
    exposition = scrape_once(tmp_path)
    names = exported_names(exposition)
    # counters are typed without their _total suffix in the exposition
    names |= {f"{n}_total" for n in names}
    missing = [n for n in EXPORTER_NAMES if n not in names and n not in RDMA_NAMES]
    assert missing == []
    assert not RDMA_NAMES & names  # absent, never a fake zero, where there is no RDMA
    # Every series says which node it is from, by the inventory's name: rules aggregate
    # by it and nothing maps a scrape address back to a node.
    samples = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    assert samples and [line for line in samples if 'node="n1"' not in line] == []


def remediator_names(tmp_path: Path) -> set[str]:
    registry = CollectorRegistry()
    inventory = parse_inventory(inventory_text(tmp_path))
    journal = Journal(tmp_path / "journal.sqlite")
    Engine(
        RemediatorConfig(journal=tmp_path / "journal.sqlite", dry_run=True),
        inventory,
        journal,
        LocalTransport(),
        registry=registry,
    )
    names = exported_names(generate_latest(registry).decode())
    return {n for n in names if not n.endswith("_created")}


def test_the_remediator_registers_every_contract_name(tmp_path: Path) -> None:
    names = remediator_names(tmp_path)
    names |= {f"{n}_total" for n in names}
    engine_names = [n for n in REMEDIATOR_NAMES if n != "mlx_medic_alerts_received_total"]
    assert [n for n in engine_names if n not in names] == []


def test_the_remediator_serves_only_what_it_decides(tmp_path: Path) -> None:
    """No node-recorded series (protection-domain debt is the exporter's, from the node's
    ledger), and the backend gauge says it is the last verified one."""
    assert remediator_names(tmp_path) - set(REMEDIATOR_NAMES) == set()
