"""The protection-domain ledger: spends counted once per process, per boot, under a lock;
disputed cycles shown, never debt; JACCL refused at the reserve."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.node.ledger import (
    LedgerError,
    jaccl_allowed,
    ledger_path,
    read_ledger,
    record_spend,
)

BOOT = "boot-1"


def spend(state: Path, pid: int, start: float = 100.0, devices: Sequence[str] = ()) -> bool:
    return record_spend(
        state, "n1", "sigkill", pid=pid, start_time=start, devices=devices, boot_id=BOOT
    )


def test_a_missing_ledger_is_an_empty_one(tmp_path: Path) -> None:
    ledger = read_ledger(tmp_path, "n1", BOOT)
    assert ledger.debt == 0 and ledger.entries == [] and ledger.boot_id == BOOT


def test_a_process_signalled_again_is_one_spend_but_a_reused_pid_is_another(
    tmp_path: Path,
) -> None:
    assert spend(tmp_path, 42) is True
    assert spend(tmp_path, 42) is False  # the frozen rank, SIGKILLed at the next restart
    assert (
        record_spend(tmp_path, "n1", "failed_start", pid=42, start_time=100.0, boot_id=BOOT)
        is False
    )  # same process: still one spend
    assert spend(tmp_path, 42, start=200.0) is True  # the pid reused by a new process
    assert read_ledger(tmp_path, "n1", BOOT).debt == 2


def test_a_failed_jaccl_start_is_a_spend(tmp_path: Path) -> None:
    record_spend(tmp_path, "n1", "failed_start", pid=7, start_time=1.0, boot_id=BOOT, model="m1")
    [entry] = read_ledger(tmp_path, "n1", BOOT).entries
    assert (entry.kind, entry.model, entry.disputed) == ("failed_start", "m1", False)


def test_init_teardown_cycles_are_disputed_and_not_debt(tmp_path: Path) -> None:
    assert (
        record_spend(tmp_path, "n1", "init_teardown", pid=5, start_time=1.0, boot_id=BOOT) is True
    )
    assert (
        record_spend(tmp_path, "n1", "init_teardown", pid=5, start_time=1.0, boot_id=BOOT) is False
    )
    ledger = read_ledger(tmp_path, "n1", BOOT)
    assert (ledger.debt, ledger.disputed_cycles) == (0, 1)
    assert ledger.entries[0].to_json()["disputed"] is True


def test_spends_count_per_device_when_known_and_against_the_node_when_not(
    tmp_path: Path,
) -> None:
    spend(tmp_path, 1, devices=["rdma_en2", "rdma_en3"])
    spend(tmp_path, 2, devices=["rdma_en2"])
    spend(tmp_path, 3)
    ledger = read_ledger(tmp_path, "n1", BOOT)
    assert ledger.debt == 3  # per node: the number of spends
    assert ledger.debt_by_unit() == {"rdma_en2": 2, "rdma_en3": 1, "node": 1}


def test_a_reboot_empties_the_ledger(tmp_path: Path) -> None:
    spend(tmp_path, 1)
    assert read_ledger(tmp_path, "n1", "boot-2").debt == 0
    assert (
        record_spend(tmp_path, "n1", "sigkill", pid=1, start_time=100.0, boot_id="boot-2") is True
    )  # a new boot: the old spends are gone
    assert read_ledger(tmp_path, "n1", "boot-2").debt == 1
    assert read_ledger(tmp_path, "n1", BOOT).debt == 0


def test_jaccl_is_refused_at_the_reserve(tmp_path: Path) -> None:
    for pid in range(1, 5):
        spend(tmp_path, pid)
    assert jaccl_allowed(read_ledger(tmp_path, "n1", BOOT), reserve=5) is True
    spend(tmp_path, 5)
    assert jaccl_allowed(read_ledger(tmp_path, "n1", BOOT), reserve=5) is False
    assert jaccl_allowed(read_ledger(tmp_path, "n1", "boot-2"), reserve=5) is True
    assert jaccl_allowed(read_ledger(tmp_path, "n1", "boot-2"), reserve=0) is False


def _spend_many(state: str, first: int) -> None:
    for pid in range(first, first + 25):
        spend(Path(state), pid)


def test_concurrent_writers_lose_no_spend(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_spend_many, args=(str(tmp_path), 1000 * i))
               for i in range(1, 5)]  # fmt: skip
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    assert read_ledger(tmp_path, "n1", BOOT).debt == 100


def test_a_corrupt_ledger_is_an_error_naming_the_file_and_is_kept(tmp_path: Path) -> None:
    ledger_path(tmp_path).write_text("{not json")
    with pytest.raises(LedgerError, match=r"pd-ledger\.json is not a readable ledger"):
        read_ledger(tmp_path, "n1", BOOT)
    with pytest.raises(LedgerError):
        spend(tmp_path, 1)
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
    assert read_ledger(elsewhere, "n1", BOOT).entries == []  # moved away: none there
    assert '"pid": 2' not in planted.read_text()


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pd-ledger.json", "pd-ledger.lock"]


def test_an_unknown_entry_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a ledger entry"):
        not_a_kind: Any = "reboot"
        record_spend(tmp_path, "n1", not_a_kind, pid=1, start_time=1.0, boot_id=BOOT)
