"""`mlx-medic node ledger`: one JSON document with a schema version and the mlx-medic
version that wrote it, the node from the inventory's state dir, the debt per RDMA device,
the survivors still alive here, each model's reserve and devices; a clear error and a
non-zero exit otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from mlx_medic.command_line import version
from mlx_medic.node.boot_id import LINUX_BOOT_ID, current_boot_id
from mlx_medic.state.ledger import record_spend
from mlx_medic.state.node_identity import write_node_id
from tests.node.inventories import two_models


def inventory(tmp_path: Path, reserve: int | None = None) -> Path:
    policy = f"\n    policy: {{pd_reserve: {reserve}}}" if reserve is not None else ""
    path = tmp_path / "inventory.yaml"
    path.write_text(two_models(str(tmp_path / "state"), m1=policy))
    return path


def node(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "node", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_ledger_prints_one_json_document_with_its_schema_and_the_models_reserves(
    tmp_path: Path,
) -> None:
    config = inventory(tmp_path, reserve=2)
    state = tmp_path / "state"
    write_node_id(state, "n1")
    boot = current_boot_id()
    record_spend(state, "n1", "sigkill", pid=10, start_time=1.0, devices=["rdma_en2"], boot_id=boot)
    record_spend(state, "n1", "vanished", pid=13, start_time=4.0, boot_id=boot)
    record_spend(state, "n1", "failed_start", pid=11, start_time=2.0, boot_id=boot)
    record_spend(state, "n1", "init_teardown", pid=12, start_time=3.0, boot_id=boot)
    result = node("ledger", "--json", "--inventory", str(config))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["node"]) == (1, "ledger", "n1")
    assert document["version"] == version()  # the mlx-medic that wrote it
    assert document["boot_id"] == boot
    assert (document["debt"], document["disputed_cycles"]) == (2, 2)  # failed starts: disputed
    assert document["debt_by_unit"] == {"rdma_en2": 1, "node": 1}
    assert document["debt_by_device"] == {"rdma_en2": 2}  # the unknown one counts there too
    assert document["reserves"] == {
        "m1": {"reserve": 2, "devices": [], "jaccl_allowed": False, "debt": 2}
    }
    assert document["survivors"] == []
    assert [e["kind"] for e in document["entries"]] == [
        "sigkill",
        "vanished",
        "failed_start",
        "init_teardown",
    ]
    assert [e["counted"] for e in document["entries"]] == [True, True, False, False]


def test_the_default_reserve_is_five_of_eleven(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--inventory", str(inventory(tmp_path)), "--node", "n2")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["reserves"] == {
        "m1": {"reserve": 5, "devices": [], "jaccl_allowed": True, "debt": 0},
        "m2": {"reserve": 5, "devices": [], "jaccl_allowed": True, "debt": 0},
    }
    assert document["debt_by_device"] == {"node": 0}  # no device known here


def test_without_json_the_ledger_is_a_readable_summary(tmp_path: Path) -> None:
    result = node("ledger", "--inventory", str(inventory(tmp_path)), "--node", "n1")
    assert result.returncode == 0
    assert "0 process(es) counted as spending protection domains" in result.stdout
    assert "model m1: reserve 5 per device, JACCL allowed" in result.stdout


def test_a_node_not_in_the_inventory_is_refused_with_exit_2(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--inventory", str(inventory(tmp_path)), "--node", "n9")
    assert result.returncode == 2 and result.stdout == ""
    assert "'n9' is not in the inventory" in result.stderr


def test_an_unnamed_node_is_refused_saying_how_to_name_it(tmp_path: Path) -> None:
    result = node("ledger", "--json", "--inventory", str(inventory(tmp_path)))
    assert result.returncode == 2  # as the exporter: it cannot start as asked
    assert "pass --node NAME" in result.stderr


def test_a_corrupt_ledger_is_refused_with_exit_1_naming_it(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pd-ledger.json").write_text("[]")
    result = node("ledger", "--inventory", str(inventory(tmp_path)), "--node", "n1")
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
    result = node("ledger", "--inventory", str(inventory(tmp_path, reserve=12)), "--node", "n1")
    assert result.returncode == 2  # an invalid inventory: it cannot start as asked
    assert "models.m1.policy.pd_reserve" in result.stderr


def jaccl_inventory(tmp_path: Path) -> Path:
    """n1 carries m1 (JACCL over n1..n3) and m2 (JACCL with n4): devices of its own each."""
    m1 = tmp_path / "m1-jaccl.json"
    m1.write_text(
        json.dumps(
            [
                {"ssh": "n1", "rdma": [None, "rdma_en2", "rdma_en3"]},
                {"ssh": "n2", "rdma": ["rdma_en2", None, "rdma_en3"]},
                {"ssh": "n3", "rdma": ["rdma_en2", "rdma_en3", None]},
            ]
        )
    )
    m2 = tmp_path / "m2-jaccl.json"
    m2.write_text(
        json.dumps(
            [{"ssh": "n1", "rdma": [None, "rdma_en4"]}, {"ssh": "n4", "rdma": ["rdma_en2", None]}]
        )
    )
    path = tmp_path / "inventory.yaml"
    path.write_text(f"""\
state_dir: {tmp_path / "state"}
nodes:
  n1: {{ssh: 127.0.0.2}}
  n2: {{ssh: 127.0.0.3}}
  n3: {{ssh: 127.0.0.4}}
  n4: {{ssh: 127.0.0.5}}
models:
  m1:
    model: /models/m1
    nodes: [n1, n2, n3]
    port: 8080
    service: {{manager: supervisord, label: m1}}
    backends: {{jaccl: {{hostfile: {m1}}}, ring: {{hostfile: /etc/ring.json}}}}
    policy: {{pd_reserve: 2}}
  m2:
    model: /models/m2
    nodes: [n1, n4]
    port: 8081
    service: {{manager: supervisord, label: m2}}
    backends: {{jaccl: {{hostfile: {m2}}}}}
    policy: {{pd_reserve: 2}}
""")
    return path


def test_the_ledger_judges_each_model_on_its_own_devices_and_lists_live_survivors_only(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
) -> None:
    config = jaccl_inventory(tmp_path)
    state = tmp_path / "state"
    boot = current_boot_id()
    started = psutil.Process(sleeper.pid).create_time()
    record_spend(
        state,
        "n1",
        "sigkill",
        pid=10,
        start_time=1.0,
        devices=["rdma_en2"],
        model="m1",
        boot_id=boot,
    )
    record_spend(
        state,
        "n1",
        "unkillable",
        pid=sleeper.pid,
        start_time=started,
        devices=["rdma_en2", "rdma_en3"],
        model="m1",
        backend="jaccl",
        cmdline=["python", "-m", "mlx_lm.server"],
        boot_id=boot,
    )
    # a survivor whose process is gone (the pid names another start): not listed, counted
    record_spend(
        state,
        "n1",
        "unkillable",
        pid=sleeper.pid,
        start_time=started - 50,
        model="m1",
        backend="ring",
        boot_id=boot,
    )
    result = node("ledger", "--json", "--inventory", str(config), "--node", "n1")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["debt"] == 2
    assert document["debt_by_device"] == {"rdma_en2": 2, "rdma_en3": 1, "rdma_en4": 0}
    assert document["reserves"] == {
        "m1": {
            "reserve": 2,
            "devices": ["rdma_en2", "rdma_en3"],
            "jaccl_allowed": False,
            "debt": 2,
        },
        "m2": {"reserve": 2, "devices": ["rdma_en4"], "jaccl_allowed": True, "debt": 0},
    }
    [survivor] = document["survivors"]
    assert survivor | {"at": 0} == {
        "pid": sleeper.pid,
        "start_time": started,
        "cmdline": ["python", "-m", "mlx_lm.server"],
        "model": "m1",
        "backend": "jaccl",
        "devices": ["rdma_en2", "rdma_en3"],
        "domains": 2,
        "holds_port": False,
        "at": 0,
    }
    text = node("ledger", "--inventory", str(config), "--node", "n1").stdout
    assert f"survivor of SIGKILL: pid {sleeper.pid} (model m1, jaccl backend, holding 2" in text
    assert "reboot n1 to end it" in text
    assert (
        "model m2: reserve 2 per device, JACCL allowed (0 spent on the busiest of rdma_en4)" in text
    )
    sleeper.kill()
    sleeper.wait()
    document = json.loads(
        node("ledger", "--json", "--inventory", str(config), "--node", "n1").stdout
    )
    assert document["survivors"] == [] and document["debt"] == 2  # per boot: still spent
