"""Is pid P, started at T, alive on node N: `ps` on N, read the same on Linux and macOS."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from mlx_medic.pid_liveness import (
    Liveness,
    judge_ps,
    liveness_argv,
    local_liveness,
    parse_lstart,
)
from mlx_medic.transport import CommandResult

START = parse_lstart("Tue Dec  1 00:26:32 2026")


def ps(exit_status: int | None, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(exit_status, stdout, stderr, timed_out=exit_status is None)


def test_the_pid_is_one_argument_of_a_fixed_command() -> None:
    assert liveness_argv(4711) == ["env", "LC_ALL=C", "TZ=UTC0", "ps", "-p", "4711",
                                   "-o", "stat=", "-o", "lstart="]
    with pytest.raises(ValueError, match="positive"):
        liveness_argv(0)


def test_lstart_is_read_as_utc() -> None:
    assert START == 1796084792.0
    with pytest.raises(ValueError):
        parse_lstart("mardi 1 décembre 2026")


@pytest.mark.parametrize(("result", "pid_start", "expected"), [
    (ps(0, "Ss   Tue Dec  1 00:26:32 2026\n"), START + 0.54, Liveness.ALIVE),
    (ps(0, "S+   Tue Dec  1 00:26:32 2026\n"), None, Liveness.ALIVE),
    (ps(0, "Ss   Tue Dec  1 00:26:32 2026\n"), START - 3600, Liveness.REUSED),
    (ps(0, "Z    Tue Dec  1 00:26:32 2026\n"), START, Liveness.DEAD),
    (ps(1), START, Liveness.DEAD),
    (ps(127, stderr="env: 'ps': No such file or directory\n"), START, Liveness.UNKNOWN),
    (ps(None), START, Liveness.UNKNOWN),
    (ps(0, "Ss   yesterday\n"), START, Liveness.UNKNOWN),
])
def test_what_ps_says_about_the_holder(result: CommandResult, pid_start: float | None,
                                       expected: Liveness) -> None:
    assert judge_ps(result, pid_start)[0] is expected


def test_this_machines_ps_agrees_with_psutil_on_start_times() -> None:
    me = os.getpid()
    started = psutil.Process(me).create_time()
    assert local_liveness(me, started)[0] is Liveness.ALIVE
    assert local_liveness(me, started - 60)[0] is Liveness.REUSED
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert local_liveness(gone.pid, None)[0] is Liveness.DEAD
