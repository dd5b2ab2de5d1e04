"""The ledger collector: the node's protection-domain debt this boot, from the ledger the
helpers write, with each model's reserve beside it; a reboot empties it."""

from __future__ import annotations

from pathlib import Path

from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.ledger import LedgerCollector
from mlx_medic.inventory import parse_inventory
from mlx_medic.node.ledger import record_spend
from tests.node.inventories import two_models

INVENTORY = two_models(m1="\n    policy: {pd_reserve: 3}")


def scrape(tmp_path: Path, boot: str, node: str | None = "n1") -> list[object]:
    context = ExporterContext(node=node, inventory=parse_inventory(INVENTORY),
                              state_dir=tmp_path)  # fmt: skip
    return list(ScrapeCollector([LedgerCollector(context, lambda: boot)], node=node).collect())


def test_the_debt_is_served_per_node_with_each_models_reserve(tmp_path: Path) -> None:
    record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=1.0, boot_id="b1")
    record_spend(tmp_path, "n1", "failed_start", pid=2, start_time=2.0, boot_id="b1")
    record_spend(
        tmp_path, "n1", "init_teardown", pid=3, start_time=3.0, boot_id="b1"
    )  # disputed: not debt
    families = scrape(tmp_path, "b1")
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 2
    assert sample_value(families, "mlx_pd_reserve", {"node": "n1", "model": "m1"}) == 3
    assert sample_value(families, "mlx_pd_reserve", {"node": "n1", "model": "m2"}) is None


def test_a_simulated_reboot_empties_the_debt(tmp_path: Path) -> None:
    record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=1.0, boot_id="b1")
    assert sample_value(scrape(tmp_path, "b2"), "mlx_pd_debt", {"node": "n1"}) == 0


def test_without_a_node_name_no_ledger_is_served(tmp_path: Path) -> None:
    families = scrape(tmp_path, "b1", node=None)
    assert sample_value(families, "mlx_pd_debt", {}) is None
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "ledger"}) == 1
