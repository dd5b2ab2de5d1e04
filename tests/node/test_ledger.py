"""The protection-domain ledger: spends counted once per process across the counted kinds,
per RDMA device (unknown devices against every device), per boot, under a lock; failed
starts and init/teardown cycles disputed, never debt; `ended` bookkeeping only; JACCL
refused where a needed device is at the reserve; older files still read."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.processes.placement import hostfile_devices
from mlx_medic.state import ledger as ledger_module
from mlx_medic.state.ledger import (
    NODE_UNIT,
    SCHEMA,
    Ledger,
    LedgerError,
    debt_by_device,
    device_debt,
    has_entry,
    jaccl_allowed,
    ledger_path,
    live_survivors,
    process_alive,
    read_ledger,
    record_ended,
    record_spend,
    start_debt,
)

BOOT = "boot-1"


def spend(
    state: Path,
    pid: int,
    start: float = 100.0,
    devices: Sequence[str] = (),
    kind: Any = "sigkill",
    **extra: Any,
) -> bool:
    return record_spend(
        state, "n1", kind, pid=pid, start_time=start, devices=devices, boot_id=BOOT, **extra
    )


def read(state: Path) -> Ledger:
    return read_ledger(state, "n1", BOOT)


def test_a_missing_ledger_is_an_empty_one(tmp_path: Path) -> None:
    ledger = read(tmp_path)
    assert ledger.debt == 0 and ledger.entries == [] and ledger.boot_id == BOOT
    assert ledger.debt_by_unit() == {} and ledger.survivors == []
    assert debt_by_device(ledger.debt_by_unit()) == {NODE_UNIT: 0}


def test_a_process_signalled_again_is_one_spend_but_a_reused_pid_is_another(
    tmp_path: Path,
) -> None:
    assert spend(tmp_path, 42) is True
    assert spend(tmp_path, 42) is False  # the frozen rank, SIGKILLed at the next restart
    assert spend(tmp_path, 42, start=100.001) is False  # the same start, read again
    assert spend(tmp_path, 42, start=200.0) is True  # the pid reused by a new process
    assert read(tmp_path).debt == 2


def test_vanished_and_unkillable_ranks_are_counted(tmp_path: Path) -> None:
    assert spend(tmp_path, 1, kind="vanished", devices=["rdma_en2"], model="m1") is True
    assert (
        spend(
            tmp_path,
            2,
            kind="unkillable",
            devices=["rdma_en3"],
            backend="jaccl",
            cmdline=["python", "-m", "mlx_lm.server"],
            model="m1",
        )
        is True
    )
    ledger = read(tmp_path)
    assert ledger.debt == 2
    assert ledger.debt_by_unit() == {"rdma_en2": 1, "rdma_en3": 1}
    [survivor] = ledger.survivors
    assert (survivor.pid, survivor.cmdline, survivor.backend, survivor.holds_port) == (
        2,
        ("python", "-m", "mlx_lm.server"),
        "jaccl",
        False,
    )


def test_one_spend_per_process_across_the_counted_kinds_on_the_union_of_its_devices(
    tmp_path: Path,
) -> None:
    """A frozen rank SIGKILLed at every restart and then recorded unkillable is one spend."""
    assert spend(tmp_path, 7, devices=["rdma_en2"]) is True
    assert (
        spend(
            tmp_path,
            7,
            kind="unkillable",
            devices=["rdma_en2", "rdma_en3"],
            backend="jaccl",
            holds_port=True,
        )
        is False
    )  # written, but no new spend
    assert spend(tmp_path, 7, kind="unkillable", backend="jaccl") is False  # once per kind
    assert spend(tmp_path, 7, kind="vanished") is False
    ledger = read(tmp_path)
    assert [e.kind for e in ledger.entries] == ["sigkill", "unkillable", "vanished"]
    assert ledger.debt == 1
    assert ledger.debt_by_unit() == {"rdma_en2": 1, "rdma_en3": 1}
    [process] = ledger.processes()
    assert process.kinds == ("sigkill", "unkillable", "vanished")
    assert ledger.survivors[0].holds_port is True


def test_a_failed_jaccl_start_spends_nothing_and_is_disputed_like_a_cycle(
    tmp_path: Path,
) -> None:
    """ibv_alloc_pd returned NULL on the refusing device; the unwind gave the others back."""
    assert (
        spend(tmp_path, 7, start=1.0, kind="failed_start", model="m1", devices=["rdma_en2"]) is True
    )
    assert spend(tmp_path, 7, start=1.0, kind="failed_start") is False  # once
    [entry] = read(tmp_path).entries
    assert (entry.kind, entry.model, entry.disputed, entry.counted) == (
        "failed_start",
        "m1",
        True,
        False,
    )
    ledger = read(tmp_path)
    assert (ledger.debt, ledger.disputed_cycles, ledger.debt_by_unit()) == (0, 1, {})
    assert entry.to_json()["disputed"] is True and entry.to_json()["counted"] is False


def test_init_teardown_cycles_are_disputed_and_not_debt(tmp_path: Path) -> None:
    assert spend(tmp_path, 5, start=1.0, kind="init_teardown") is True
    assert spend(tmp_path, 5, start=1.0, kind="init_teardown") is False
    assert spend(tmp_path, 6, start=1.0, kind="failed_start") is True
    ledger = read(tmp_path)
    assert (ledger.debt, ledger.disputed_cycles) == (0, 2)
    assert ledger.entries[0].to_json()["disputed"] is True


def test_a_sigkilled_rank_after_its_disputed_cycle_is_still_one_spend(tmp_path: Path) -> None:
    assert spend(tmp_path, 5, kind="init_teardown") is True
    assert spend(tmp_path, 5) is True  # the cycle was never debt: this is the first spend
    ledger = read(tmp_path)
    assert (ledger.debt, ledger.disputed_cycles) == (1, 1)


def test_ended_is_bookkeeping_written_once_for_many_processes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[int] = []
    real_write = ledger_module._write

    def counting(state_dir: Path, ledger: Ledger) -> None:
        writes.append(len(ledger.entries))
        real_write(state_dir, ledger)

    monkeypatch.setattr(ledger_module, "_write", counting)
    processes = [(11, 1.0, "m1", ("rdma_en2",)), (12, 2.0, "m1", ()), (13, 3.0, None, ())]
    assert record_ended(tmp_path, "n1", processes, boot_id=BOOT) == 3
    assert writes == [3]  # one write for all three
    assert record_ended(tmp_path, "n1", processes[:2], boot_id=BOOT) == 0  # noted already
    assert record_ended(tmp_path, "n1", [], boot_id=BOOT) == 0
    assert writes == [3]
    ledger = read(tmp_path)
    assert (ledger.debt, ledger.disputed_cycles, ledger.debt_by_unit()) == (0, 0, {})
    assert [(e.kind, e.pid, e.devices, e.model) for e in ledger.entries] == [
        ("ended", 11, ("rdma_en2",), "m1"),
        ("ended", 12, (), "m1"),
        ("ended", 13, (), None),
    ]
    assert all(not e.disputed and not e.counted for e in ledger.entries)
    assert has_entry(ledger, 12, 2.0) and not has_entry(ledger, 12, 2.5)
    # the sweep's SIGKILL that follows is a spend all the same
    assert spend(tmp_path, 11, start=1.0, devices=["rdma_en2"]) is True
    assert read(tmp_path).debt == 1


def test_has_entry_knows_any_kind(tmp_path: Path) -> None:
    spend(tmp_path, 1, start=1.0)
    spend(tmp_path, 2, start=2.0, kind="failed_start")
    spend(tmp_path, 3, start=3.0, kind="unkillable", backend="ring")
    ledger = read(tmp_path)
    assert all(has_entry(ledger, pid, float(pid)) for pid in (1, 2, 3))
    assert not has_entry(ledger, 4, 4.0) and not has_entry(ledger, 1, 9.0)


def test_spends_count_per_device_and_unknown_devices_against_every_device(
    tmp_path: Path,
) -> None:
    spend(tmp_path, 1, devices=["rdma_en2", "rdma_en3"])
    spend(tmp_path, 2, devices=["rdma_en2"])
    spend(tmp_path, 3)  # its devices unknown: counted on each device, to be safe
    ledger = read(tmp_path)
    assert ledger.debt == 3  # the node's total: the number of counted processes
    units = ledger.debt_by_unit()
    assert units == {"rdma_en2": 2, "rdma_en3": 1, "node": 1}
    assert (device_debt(units, "rdma_en2"), device_debt(units, "rdma_en3")) == (3, 2)
    assert device_debt(units, "rdma_en4") == 1  # a device no spend names: the unknown one
    assert debt_by_device(units) == {"rdma_en2": 3, "rdma_en3": 2}
    assert debt_by_device(units, ["rdma_en4"]) == {"rdma_en2": 3, "rdma_en3": 2, "rdma_en4": 1}
    assert debt_by_device({"node": 2}) == {"node": 2}  # no device known: the node alone
    assert debt_by_device({"node": 2}, ["rdma_en5"]) == {"rdma_en5": 2}


def test_jaccl_is_refused_where_a_needed_device_is_at_the_reserve(tmp_path: Path) -> None:
    for pid in range(1, 5):
        spend(tmp_path, pid, devices=["rdma_en2"])
    spend(tmp_path, 5, devices=["rdma_en3"])
    ledger = read(tmp_path)
    assert jaccl_allowed(ledger, reserve=5, devices=["rdma_en2"]) is True  # 4 < 5
    spend(tmp_path, 6, devices=["rdma_en2"])
    ledger = read(tmp_path)
    assert ledger.debt == 6
    assert jaccl_allowed(ledger, reserve=5, devices=["rdma_en2"]) is False  # 5 of 5
    assert jaccl_allowed(ledger, reserve=5, devices=["rdma_en3"]) is True  # 1 of 5
    assert jaccl_allowed(ledger, reserve=5, devices=["rdma_en3", "rdma_en2"]) is False
    assert jaccl_allowed(ledger, reserve=5) is False  # no devices known: the busiest one
    assert jaccl_allowed(ledger.debt_by_unit(), 5, ["rdma_en3"]) is True  # units work too
    assert start_debt(ledger, ["rdma_en3"]) == 1 and start_debt(ledger) == 5
    assert jaccl_allowed(read_ledger(tmp_path, "n1", "boot-2"), reserve=5) is True
    assert jaccl_allowed(read_ledger(tmp_path, "n1", "boot-2"), reserve=0) is False


def test_a_spend_of_unknown_devices_refuses_every_device_at_the_reserve(tmp_path: Path) -> None:
    for pid in range(1, 3):
        spend(tmp_path, pid)
    spend(tmp_path, 3, devices=["rdma_en2"])
    units = read(tmp_path).debt_by_unit()
    assert jaccl_allowed(units, 3, ["rdma_en3"]) is True  # 2 unknown < 3
    assert jaccl_allowed(units, 3, ["rdma_en2"]) is False  # 2 unknown + 1
    assert jaccl_allowed(units, 3) is False  # busiest: rdma_en2


def test_a_survivor_that_holds_no_jaccl_domain_is_recorded_but_spends_nothing(
    tmp_path: Path,
) -> None:
    assert spend(tmp_path, 1, kind="unkillable", backend="ring", model="m1") is True
    assert spend(tmp_path, 2, kind="unkillable", backend="none", model="m1") is True
    assert spend(tmp_path, 3, kind="unkillable", backend="unknown", model="m1") is True
    ledger = read(tmp_path)
    assert [s.pid for s in ledger.survivors] == [1, 2, 3]
    assert ledger.debt == 1  # only the one that may be a JACCL rank
    assert [s.survivor("n1").domains for s in ledger.survivors] == [0, 0, 0]


def test_a_reboot_empties_the_ledger(tmp_path: Path) -> None:
    spend(tmp_path, 1)
    assert read_ledger(tmp_path, "n1", "boot-2").debt == 0
    assert (
        record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=100.0, boot_id="boot-2") is True
    )  # a new boot: the old spends are gone
    assert read_ledger(tmp_path, "n1", "boot-2").debt == 1
    assert read_ledger(tmp_path, "n1", BOOT).debt == 0


SCHEMA_1_FILE = {
    "schema": 1,
    "node": "n1",
    "boot_id": BOOT,
    "entries": [
        {
            "kind": "sigkill",
            "pid": 1,
            "start_time": 1.0,
            "devices": ["rdma_en2"],
            "model": "m1",
            "at": 5.0,
            "disputed": False,
        },
        {
            "kind": "failed_start",
            "pid": 2,
            "start_time": 2.0,
            "devices": [],
            "model": "m1",
            "at": 6.0,
            "disputed": False,
        },
        {
            "kind": "init_teardown",
            "pid": 3,
            "start_time": 3.0,
            "devices": [],
            "model": None,
            "at": 7.0,
            "disputed": True,
        },
    ],
}


def test_a_schema_1_ledger_still_reads_and_its_failed_starts_spend_nothing(
    tmp_path: Path,
) -> None:
    ledger_path(tmp_path).write_text(json.dumps(SCHEMA_1_FILE))
    ledger = read(tmp_path)
    assert [e.kind for e in ledger.entries] == ["sigkill", "failed_start", "init_teardown"]
    assert (ledger.debt, ledger.disputed_cycles) == (1, 2)
    assert ledger.debt_by_unit() == {"rdma_en2": 1}
    assert ledger.entries[0].cmdline == () and ledger.entries[0].backend is None
    # the next write keeps every entry and writes the current schema
    assert spend(tmp_path, 4, kind="vanished") is True
    data = json.loads(ledger_path(tmp_path).read_text())
    assert data["schema"] == SCHEMA == 2
    assert [e["kind"] for e in data["entries"]] == [
        "sigkill",
        "failed_start",
        "init_teardown",
        "vanished",
    ]
    assert read(tmp_path).debt == 2


def test_an_unknown_schema_or_entry_kind_in_the_file_is_refused(tmp_path: Path) -> None:
    ledger_path(tmp_path).write_text(json.dumps({**SCHEMA_1_FILE, "schema": 3}))
    with pytest.raises(LedgerError, match="schema 3"):
        read(tmp_path)
    bad = {
        **SCHEMA_1_FILE,
        "schema": 2,
        "entries": [{"kind": "reboot", "pid": 1, "start_time": 1.0}],
    }
    ledger_path(tmp_path).write_text(json.dumps(bad))
    with pytest.raises(LedgerError, match="'reboot'"):
        read(tmp_path)


def test_entries_that_are_no_debt_are_kept_to_a_bound_and_dropped_cycles_still_count(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "MAX_ENDED", 3)
    monkeypatch.setattr(ledger_module, "MAX_DISPUTED", 2)
    spend(tmp_path, 1000)  # debt is never dropped
    record_ended(tmp_path, "n1", [(pid, 1.0, "m1", ()) for pid in range(1, 6)], boot_id=BOOT)
    for pid in range(10, 15):
        spend(tmp_path, pid, start=1.0, kind="failed_start")
    ledger = read(tmp_path)
    assert [e.pid for e in ledger.entries if e.kind == "ended"] == [3, 4, 5]  # the newest
    assert [e.pid for e in ledger.entries if e.disputed] == [13, 14]
    assert (ledger.debt, ledger.disputed_cycles, ledger.cycles_dropped) == (1, 5, 3)


def test_a_survivor_lives_while_its_pid_names_the_same_process(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
) -> None:
    started = psutil.Process(sleeper.pid).create_time()
    spend(
        tmp_path,
        sleeper.pid,
        start=started,
        kind="unkillable",
        backend="jaccl",
        devices=["rdma_en2"],
        model="m1",
    )
    spend(
        tmp_path, sleeper.pid, start=started + 1.0, kind="unkillable", backend="jaccl", model="m1"
    )  # the same pid, another start: a reused pid
    assert process_alive(sleeper.pid, started) is True
    assert process_alive(sleeper.pid, started + 1.0) is False
    [live] = live_survivors(read(tmp_path))
    assert (live.pid, live.start_time, live.devices) == (sleeper.pid, started, ("rdma_en2",))
    sleeper.kill()
    sleeper.wait()
    assert live_survivors(read(tmp_path)) == []
    assert read(tmp_path).debt == 2  # the ledger is per boot: a gone survivor still counts


def jaccl_inventory(tmp_path: Path, hostfile: object) -> Any:
    """ai002 carries two models: glm on ai001..ai003, qwq on ai002 and ai004."""
    glm = tmp_path / "glm-jaccl.json"
    glm.write_text(hostfile if isinstance(hostfile, str) else json.dumps(hostfile))
    qwq = tmp_path / "qwq-jaccl.json"
    qwq.write_text(
        json.dumps(
            [
                {"ssh": "ai002", "rdma": [None, "rdma_en4"]},
                {"ssh": "ai004", "rdma": ["rdma_en2", None]},
            ]
        )
    )
    return parse_inventory(f"""\
nodes:
  ai001: {{ssh: 192.168.101.1}}
  ai002: {{ssh: 192.168.101.2}}
  ai003: {{ssh: 192.168.101.3}}
  ai004: {{ssh: 192.168.101.4}}
models:
  glm:
    model: /models/glm
    nodes: [ai001, ai002, ai003]
    port: 8080
    service: {{manager: supervisord, label: glm}}
    backends: {{jaccl: {{hostfile: {glm}}}, ring: {{hostfile: /etc/ring.json}}}}
  qwq:
    model: /models/qwq
    nodes: [ai002, ai004]
    port: 8081
    service: {{manager: supervisord, label: qwq}}
    backends: {{jaccl: {{hostfile: {qwq}}}}}
  ringonly:
    model: /models/r
    nodes: [ai002]
    port: 8082
    service: {{manager: supervisord, label: ringonly}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
""")


GLM_HOSTFILE = [
    {"ssh": "ai001", "ips": ["192.168.101.1"], "rdma": [None, "rdma_en2", "rdma_en3"]},
    {"ssh": "ai002", "ips": ["192.168.101.2"], "rdma": ["rdma_en2", None, "rdma_en3"]},
    {"ssh": "ai003", "ips": ["192.168.101.3"], "rdma": ["rdma_en2", "rdma_en3", None]},
]


def test_a_models_devices_on_a_node_are_its_jaccl_hostfile_row_in_node_order(
    tmp_path: Path,
) -> None:
    inventory = jaccl_inventory(tmp_path, GLM_HOSTFILE)
    glm, qwq, ringonly = (inventory.model(n) for n in ("glm", "qwq", "ringonly"))
    assert hostfile_devices(glm, "ai002") == ("rdma_en2", "rdma_en3")
    assert hostfile_devices(qwq, "ai002") == ("rdma_en4",)
    assert hostfile_devices(qwq, "ai004") == ("rdma_en2",)
    assert hostfile_devices(ringonly, "ai002") == ()  # no JACCL backend
    assert hostfile_devices(glm, "ai004") == ()  # not placed there


@pytest.mark.parametrize(
    "hostfile",
    [
        "{not json",
        json.dumps({"ssh": "ai001"}),
        json.dumps([{"ssh": "ai001"}]),
        json.dumps([GLM_HOSTFILE[0]]),  # no row for ai002
        json.dumps([GLM_HOSTFILE[0], "ai002", GLM_HOSTFILE[2]]),
    ],
)
def test_a_hostfile_that_says_nothing_readable_gives_no_devices(
    tmp_path: Path,
    hostfile: str,
) -> None:
    inventory = jaccl_inventory(tmp_path, hostfile)
    assert hostfile_devices(inventory.model("glm"), "ai002") == ()
    (tmp_path / "glm-jaccl.json").unlink()
    assert hostfile_devices(inventory.model("glm"), "ai002") == ()  # not on this node


def test_several_models_on_one_node_are_judged_on_the_devices_each_needs(
    tmp_path: Path,
) -> None:
    inventory = jaccl_inventory(tmp_path, GLM_HOSTFILE)
    glm, qwq = (hostfile_devices(inventory.model(n), "ai002") for n in ("glm", "qwq"))
    for pid in range(1, 4):  # glm's ranks spent on its devices, the ones it shares with none
        spend(tmp_path, pid, devices=["rdma_en2", "rdma_en3"], model="glm")
    units = read(tmp_path).debt_by_unit()
    assert jaccl_allowed(units, 3, glm) is False
    assert jaccl_allowed(units, 3, qwq) is True  # rdma_en4 is untouched
    spend(tmp_path, 9, model="qwq")  # a spend of unknown devices reaches every device
    units = read(tmp_path).debt_by_unit()
    assert (start_debt(units, glm), start_debt(units, qwq)) == (4, 1)
    assert debt_by_device(units, [*glm, *qwq]) == {"rdma_en2": 4, "rdma_en3": 4, "rdma_en4": 1}


def _spend_many(state: str, first: int) -> None:
    for pid in range(first, first + 25):
        spend(Path(state), pid)


def test_concurrent_writers_lose_no_spend(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_spend_many, args=(str(tmp_path), 1000 * i)) for i in range(1, 5)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    assert read(tmp_path).debt == 100


def test_a_corrupt_ledger_is_an_error_naming_the_file_and_is_kept(tmp_path: Path) -> None:
    ledger_path(tmp_path).write_text("{not json")
    with pytest.raises(LedgerError, match=r"pd-ledger\.json is not a readable ledger"):
        read(tmp_path)
    with pytest.raises(LedgerError):
        spend(tmp_path, 1)
    with pytest.raises(LedgerError):
        record_ended(tmp_path, "n1", [(1, 1.0, None, ())], boot_id=BOOT)
    assert ledger_path(tmp_path).read_text() == "{not json"


def test_a_ledger_behind_a_symlink_is_never_read_nor_written_through(tmp_path: Path) -> None:
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    state.mkdir()
    elsewhere.mkdir()
    planted = elsewhere / "ledger.json"
    spend(elsewhere, 1)  # a readable ledger, of this node and boot
    (elsewhere / "pd-ledger.json").rename(planted)
    ledger_path(state).symlink_to(planted)
    with pytest.raises(LedgerError, match="symlink"):
        read_ledger(state, "n1", BOOT)
    with pytest.raises(LedgerError, match="symlink"):
        spend(state, 2)
    with pytest.raises(LedgerError, match="symlink"):
        record_ended(state, "n1", [(3, 1.0, None, ())], boot_id=BOOT)
    assert read_ledger(elsewhere, "n1", BOOT).entries == []  # moved away: none there
    assert '"pid": 2' not in planted.read_text() and '"pid": 3' not in planted.read_text()


def test_the_ledgers_lock_file_is_never_opened_through_a_symlink(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "not-a-lock"
    (state / "pd-ledger.lock").symlink_to(target)
    with pytest.raises(LedgerError, match=r"cannot open .*pd-ledger\.lock"):
        spend(state, 1)
    assert not target.exists() and not ledger_path(state).exists()


def test_another_nodes_ledger_is_refused(tmp_path: Path) -> None:
    spend(tmp_path, 1)
    with pytest.raises(LedgerError, match="node 'n1'"):
        read_ledger(tmp_path, "n2", BOOT)


def test_a_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    spend(tmp_path, 1)
    record_ended(tmp_path, "n1", [(2, 1.0, None, ())], boot_id=BOOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pd-ledger.json", "pd-ledger.lock"]


def test_an_unknown_entry_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a ledger entry"):
        not_a_kind: Any = "reboot"
        record_spend(tmp_path, "n1", not_a_kind, pid=1, start_time=1.0, boot_id=BOOT)
