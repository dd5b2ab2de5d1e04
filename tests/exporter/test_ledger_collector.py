"""The ledger collector: the node's protection-domain debt this boot (its total and per RDMA
device) from the ledger the helpers write, each model's reserve beside it, the survivors of
SIGKILL still alive here with the domains they hold, and the models placed here; a reboot
empties it, a bad ledger fails the collector (never the scrape), a symlink is never read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.ledger import LedgerCollector
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.state.ledger import record_spend
from tests.node.inventories import two_models

INVENTORY = two_models(m1="\n    policy: {pd_reserve: 3}")


def scrape(
    tmp_path: Path, boot: str, node: str | None = "n1", inventory: str = INVENTORY
) -> list[object]:
    context = ExporterContext(node=node, inventory=parse_inventory(inventory), state_dir=tmp_path)
    return list(ScrapeCollector([LedgerCollector(context, lambda: boot)], node=node).collect())


def samples(families: list[object], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in families
        for s in getattr(f, "samples", [])
        if s.name == name
    }


def test_the_debt_is_served_per_node_with_each_models_reserve(tmp_path: Path) -> None:
    record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=1.0, boot_id="b1")
    record_spend(tmp_path, "n1", "vanished", pid=2, start_time=2.0, boot_id="b1")
    record_spend(
        tmp_path, "n1", "failed_start", pid=4, start_time=4.0, boot_id="b1"
    )  # disputed: a failed start spends nothing
    record_spend(
        tmp_path, "n1", "init_teardown", pid=3, start_time=3.0, boot_id="b1"
    )  # disputed: not debt
    families = scrape(tmp_path, "b1")
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 2
    assert sample_value(families, "mlx_pd_reserve", {"node": "n1", "model": "m1"}) == 3
    assert sample_value(families, "mlx_pd_reserve", {"node": "n1", "model": "m2"}) is None
    # no device known on this node: the node stands for them
    assert samples(families, "mlx_pd_device_debt") == {(("device", "node"), ("node", "n1")): 2}
    assert samples(families, "mlx_node_models_info") == {(("models", "m1"), ("node", "n1")): 1}
    (tmp_path / "n2").mkdir()
    assert (
        sample_value(
            scrape(tmp_path / "n2", "b1", node="n2"),
            "mlx_node_models_info",
            {"node": "n2", "models": "m1,m2"},
        )
        == 1
    )  # every model, sorted


def test_a_simulated_reboot_empties_the_debt(tmp_path: Path) -> None:
    record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=1.0, boot_id="b1")
    families = scrape(tmp_path, "b2")
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 0
    assert sample_value(families, "mlx_pd_device_debt", {"node": "n1", "device": "node"}) == 0


def test_without_a_node_name_no_ledger_is_served(tmp_path: Path) -> None:
    families = scrape(tmp_path, "b1", node=None)
    assert sample_value(families, "mlx_pd_debt", {}) is None
    assert sample_value(families, "mlx_unkillable_processes", {"model": "m1"}) is None
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "ledger"}) == 1


JACCL_INVENTORY = """\
nodes:
  n1: {{ssh: 127.0.0.2}}
  n2: {{ssh: 127.0.0.3}}
  n3: {{ssh: 127.0.0.4}}
models:
  m1:
    model: /models/m1
    nodes: [n1, n2, n3]
    port: 8080
    service: {{manager: supervisord, label: m1}}
    backends: {{jaccl: {{hostfile: {hostfile}}}}}
  m2:
    model: /models/m2
    nodes: [n1]
    port: 8081
    service: {{manager: supervisord, label: m2}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
"""


def jaccl_inventory(tmp_path: Path) -> str:
    hostfile = tmp_path / "m1-jaccl.json"
    hostfile.write_text(
        json.dumps(
            [
                {"ssh": "n1", "rdma": [None, "rdma_en2", "rdma_en3"]},
                {"ssh": "n2", "rdma": ["rdma_en2", None, "rdma_en3"]},
                {"ssh": "n3", "rdma": ["rdma_en2", "rdma_en3", None]},
            ]
        )
    )
    return JACCL_INVENTORY.format(hostfile=hostfile)


def test_the_debt_is_served_per_device_with_unknown_devices_counted_on_each(
    tmp_path: Path,
) -> None:
    inventory = jaccl_inventory(tmp_path)
    record_spend(
        tmp_path, "n1", "sigkill", pid=1, start_time=1.0, devices=["rdma_en2"], boot_id="b1"
    )
    record_spend(tmp_path, "n1", "sigkill", pid=2, start_time=2.0, boot_id="b1")  # unknown
    record_spend(
        tmp_path,
        "n1",
        "unkillable",
        pid=1,
        start_time=1.0,
        backend="jaccl",
        devices=["rdma_en2", "rdma_en5"],
        boot_id="b1",
    )  # the same process
    families = scrape(tmp_path, "b1", inventory=inventory)
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 2
    assert samples(families, "mlx_pd_device_debt") == {
        (("device", "rdma_en2"), ("node", "n1")): 2,
        (("device", "rdma_en3"), ("node", "n1")): 1,  # m1's device by its hostfile
        (("device", "rdma_en5"), ("node", "n1")): 2,
    }


def test_live_survivors_are_served_per_model_with_the_domains_they_hold(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
) -> None:
    inventory = jaccl_inventory(tmp_path)
    started = psutil.Process(sleeper.pid).create_time()
    record_spend(
        tmp_path,
        "n1",
        "unkillable",
        pid=sleeper.pid,
        start_time=started,
        backend="jaccl",
        devices=["rdma_en2", "rdma_en3"],
        model="m1",
        boot_id="b1",
    )
    families = scrape(tmp_path, "b1", inventory=inventory)
    assert samples(families, "mlx_unkillable_processes") == {
        (("model", "m1"), ("node", "n1")): 1,
        (("model", "m2"), ("node", "n1")): 0,
    }
    assert samples(families, "mlx_unkillable_domains") == {
        (("model", "m1"), ("node", "n1")): 2,
        (("model", "m2"), ("node", "n1")): 0,
    }
    assert samples(families, "mlx_node_models_info") == {(("models", "m1,m2"), ("node", "n1")): 1}
    sleeper.kill()
    sleeper.wait()
    families = scrape(tmp_path, "b1", inventory=inventory)  # gone: the alert can resolve
    assert sample_value(families, "mlx_unkillable_processes", {"node": "n1", "model": "m1"}) == 0
    assert sample_value(families, "mlx_unkillable_domains", {"node": "n1", "model": "m1"}) == 0
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 1  # spent until reboot


def test_a_survivor_whose_pid_now_names_another_process_is_gone(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
) -> None:
    started = psutil.Process(sleeper.pid).create_time()
    record_spend(
        tmp_path,
        "n1",
        "unkillable",
        pid=sleeper.pid,
        start_time=started - 30,
        backend="jaccl",
        model="m1",
        boot_id="b1",
    )  # the pid, reused since
    families = scrape(tmp_path, "b1")
    assert sample_value(families, "mlx_unkillable_processes", {"node": "n1", "model": "m1"}) == 0


def test_a_survivor_of_unknown_devices_holds_one_domain_and_a_ring_rank_none(
    tmp_path: Path,
) -> None:
    for pid, backend in ((11, "jaccl"), (12, "ring"), (13, "none")):
        record_spend(
            tmp_path,
            "n1",
            "unkillable",
            pid=pid,
            start_time=float(pid),
            backend=backend,
            model="m1",
            boot_id="b1",
        )
    context = ExporterContext(node="n1", inventory=parse_inventory(INVENTORY), state_dir=tmp_path)
    collector = LedgerCollector(context, lambda: "b1", alive=lambda pid, start: True)
    families = list(ScrapeCollector([collector], node="n1").collect())
    assert sample_value(families, "mlx_unkillable_processes", {"node": "n1", "model": "m1"}) == 3
    assert sample_value(families, "mlx_unkillable_domains", {"node": "n1", "model": "m1"}) == 1
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) == 1  # only the JACCL one


@pytest.mark.parametrize("planted", ["{not json", "symlink"])
def test_a_bad_or_planted_ledger_fails_the_collector_never_the_scrape(
    tmp_path: Path,
    planted: str,
) -> None:
    path = tmp_path / "pd-ledger.json"
    if planted == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        record_spend(elsewhere, "n1", "sigkill", pid=1, start_time=1.0, boot_id="b1")
        path.symlink_to(elsewhere / "pd-ledger.json")
    else:
        path.write_text(planted)
    families = scrape(tmp_path, "b1")
    assert (
        sample_value(families, "mlx_medic_collector_success", {"node": "n1", "collector": "ledger"})
        == 0
    )
    assert sample_value(families, "mlx_pd_debt", {"node": "n1"}) is None
