"""On Linux the doctor reads /proc/<pid>/stat as the exporter's process table does: this
machine's own /proc is the verbatim fixture."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlx_medic.doctor.framework import CHECKS, FAILED, NOT_APPLICABLE, PASSED, run_check
from mlx_medic.doctor.linux_facts import proc_states  # noqa: F401  (registers the check)
from tests.doctor.fakes import Machine, context

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def only(**kwargs):
    (result,) = run_check(CHECKS["proc-states"], context(Machine(), platform="linux", **kwargs))
    return result


@linux_only
def test_this_machines_proc_reads_as_the_exporter_reads_it():
    result = only()
    assert result.status == PASSED, result
    assert "processes, states " in result.detail and "S " in result.detail


@linux_only
def test_a_stat_the_exporter_cannot_read_fails_naming_the_pid(tmp_path: Path):
    own = Path("/proc/self/stat").read_bytes()  # verbatim: this process's own stat
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "stat").write_bytes(own)
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "stat").write_bytes(own.split(b")")[0])  # cut after comm
    result = only(proc_root=tmp_path)
    assert result.status == FAILED
    assert result.detail.startswith("1 processes' stat the exporter does not read, e.g. 2: ")
    assert "proc_linux.py" in result.fix


def test_proc_states_is_not_applicable_on_macos():
    (result,) = run_check(CHECKS["proc-states"], context(Machine(), platform="darwin"))
    assert result.status == NOT_APPLICABLE and "ps-states" in result.detail
