"""A process's identity read afresh, on Linux: its start time comes from the one boot-time
reader LinuxProcessTable uses, and a boot time that cannot be read makes the identity
unreadable (None), never an exception out of read_identity."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_medic.platform import proc_linux, process_identity
from mlx_medic.platform.proc_linux import LinuxProcessTable, read_boot_time
from mlx_medic.platform.process_identity import read_identity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def fresh_clock() -> Iterator[None]:
    process_identity._linux_clock.cache_clear()
    yield
    process_identity._linux_clock.cache_clear()


def test_the_boot_time_is_the_kernels_btime(tmp_path: Path) -> None:
    (tmp_path / "stat").write_bytes(b"cpu  1 2 3\nbtime 1764561600\nprocesses 9\n")
    assert read_boot_time(tmp_path) == 1764561600.0
    assert read_boot_time() > 0


@pytest.mark.parametrize("stat", [None, b"cpu  1 2 3\n", b"btime \n", b"btime soon\n"])
def test_a_missing_or_bad_boot_time_is_an_error_and_the_table_still_lists(
    tmp_path: Path, stat: bytes | None
) -> None:
    if stat is not None:
        (tmp_path / "stat").write_bytes(stat)
    with pytest.raises((OSError, ValueError)):
        read_boot_time(tmp_path)
    assert LinuxProcessTable(tmp_path)._boot_time == 0.0  # process ages off, as logged


def test_an_unreadable_boot_time_reads_as_no_identity_and_is_read_again_later(
    fresh_clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(proc_root: str = "/proc") -> float:
        raise PermissionError(13, "Permission denied", f"{proc_root}/stat")

    monkeypatch.setattr(proc_linux, "read_boot_time", unreadable)
    assert read_identity(os.getpid()) is None
    monkeypatch.undo()
    assert read_identity(os.getpid()) is not None
