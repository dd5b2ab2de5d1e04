"""`mlx-medic node ledger`: one JSON document with a schema version, the node from the
inventory's state dir, each model's reserve; a clear error and a non-zero exit otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mlx_medic.node.boot_id import LINUX_BOOT_ID, current_boot_id
from mlx_medic.node.ledger import record_spend
from mlx_medic.node_identity import write_node_id
from tests.node.inventories import two_models


def inventory(tmp_path: Path, reserve: int | None = None) -> Path:
    policy = f"\n    policy: {{pd_reserve: {reserve}}}" if reserve is not None else ""
    path = tmp_path / "inventory.yaml"
    path.write_text(two_models(str(tmp_path / "state"), m1=policy))
    return path


def node(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlx_medic.cli", "node", *argv],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_ledger_prints_one_json_document_with_its_schema_and_the_models_reserves(
    tmp_path: Path,
) -> None:
    config = inventory(tmp_path, reserve=2)
    state = tmp_path / "state"
    write_node_id(state, "n1")
    boot = current_boot_id()
    record_spend(state, "n1", "sigkill", pid=10, start_time=1.0, devices=["rdma_en2"], boot_id=boot)
    record_spend(state, "n1", "failed_start", pid=11, start_time=2.0, boot_id=boot)
    record_spend(state, "n1", "init_teardown", pid=12, start_time=3.0, boot_id=boot)
    result = node("ledger", "--json", "--config.file", str(config))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["node"]) == (1, "ledger", "n1")
    assert document["boot_id"] == boot
    assert (document["debt"], document["disputed_cycles"]) == (2, 1)
    assert document["debt_by_unit"] == {"rdma_en2": 1, "node": 1}
    assert document["reserves"] == {"m1": {"reserve": 2, "jaccl_allowed": False}}
    assert [e["kind"] for e in document["entries"]] == ["sigkill", "failed_start", "init_teardown"]


def test_the_default_reserve_is_five_of_eleven(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--config.file", str(inventory(tmp_path)), "--node", "n2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reserves"] == {
        "m1": {"reserve": 5, "jaccl_allowed": True}, "m2": {"reserve": 5, "jaccl_allowed": True},
    }  # fmt: skip


def test_without_json_the_ledger_is_a_readable_summary(tmp_path: Path) -> None:
    result = node("ledger", "--config.file", str(inventory(tmp_path)), "--node", "n1")
    assert result.returncode == 0
    assert "0 protection domain(s) spent" in result.stdout
    assert "model m1: reserve 5, JACCL allowed" in result.stdout


def test_a_node_not_in_the_inventory_is_refused_with_exit_1(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--config.file", str(inventory(tmp_path)), "--node", "n9")
    assert result.returncode == 1 and result.stdout == ""
    assert "'n9' is not in the inventory" in result.stderr


def test_an_unnamed_node_is_refused_saying_how_to_name_it(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--config.file", str(inventory(tmp_path)))
    assert result.returncode == 1
    assert "pass --node NAME" in result.stderr


def test_a_corrupt_ledger_is_refused_with_exit_1_naming_it(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pd-ledger.json").write_text("[]")
    result = node("ledger", "--config.file", str(inventory(tmp_path)), "--node", "n1")
    assert result.returncode == 1
    assert "pd-ledger.json is not a readable ledger" in result.stderr


def test_an_unknown_helper_or_option_is_a_usage_error(tmp_path: Path) -> None:
    assert node("reboot").returncode == 2
    assert node("ledger", "--bogus").returncode == 2


def test_the_boot_id_is_the_kernels_on_linux_and_the_boot_time_elsewhere() -> None:
    import psutil

    if LINUX_BOOT_ID.exists():
        assert current_boot_id("linux") == LINUX_BOOT_ID.read_text().strip()
    assert current_boot_id("darwin") == f"boottime:{int(psutil.boot_time())}"


def test_a_reserve_beyond_a_devices_eleven_domains_is_an_inventory_error(tmp_path: Path) -> None:
    result = node("ledger", "--config.file", str(inventory(tmp_path, reserve=12)), "--node", "n1")
    assert result.returncode == 1
    assert "models.m1.policy.pd_reserve" in result.stderr
