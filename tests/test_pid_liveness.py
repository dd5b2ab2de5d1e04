"""Is pid P, started at T, alive on node N: `ps` on N, read the same on Linux and macOS."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from mlx_medic.processes.pid_liveness import (
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
    assert liveness_argv(4711) == [
        "env",
        "LC_ALL=C",
        "TZ=UTC0",
        "ps",
        "-p",
        "4711",
        "-o",
        "stat=",
        "-o",
        "lstart=",
    ]
    with pytest.raises(ValueError, match="positive"):
        liveness_argv(0)


def test_lstart_is_read_as_utc() -> None:
    assert START == 1796084792.0
    with pytest.raises(ValueError):
        parse_lstart("mardi 1 décembre 2026")


@pytest.mark.parametrize(
    ("result", "pid_start", "expected"),
    [
        (ps(0, "Ss   Tue Dec  1 00:26:32 2026\n"), START + 0.54, Liveness.ALIVE),
        (ps(0, "S+   Tue Dec  1 00:26:32 2026\n"), None, Liveness.ALIVE),
        (ps(0, "Ss   Tue Dec  1 00:26:32 2026\n"), START - 3600, Liveness.REUSED),
        (ps(0, "Z    Tue Dec  1 00:26:32 2026\n"), START, Liveness.DEAD),
        (ps(1), START, Liveness.DEAD),
        (ps(127, stderr="env: 'ps': No such file or directory\n"), START, Liveness.UNKNOWN),
        (ps(None), START, Liveness.UNKNOWN),
        (ps(0, "Ss   yesterday\n"), START, Liveness.UNKNOWN),
    ],
)
def test_what_ps_says_about_the_holder(
    result: CommandResult, pid_start: float | None, expected: Liveness
) -> None:
    assert judge_ps(result, pid_start)[0] is expected


def test_this_machines_ps_agrees_with_psutil_on_start_times() -> None:
    me = os.getpid()
    started = psutil.Process(me).create_time()
    assert local_liveness(me, started)[0] is Liveness.ALIVE
    assert local_liveness(me, started - 60)[0] is Liveness.REUSED
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert local_liveness(gone.pid, None)[0] is Liveness.DEAD


def _fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str | None) -> None:
    """`env` (the first word of the liveness argv) found first on PATH: `script`, or (the
    only one on PATH) a file that is not executable."""
    fake = tmp_path / "env"
    fake.write_text(script or "not a program\n")
    fake.chmod(0o755 if script else 0o644)
    rest = f"{os.pathsep}{os.environ['PATH']}" if script else ""
    monkeypatch.setenv("PATH", f"{tmp_path}{rest}")


def test_a_ps_answer_that_is_not_utf8_is_read_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_env(tmp_path, monkeypatch, "#!/bin/sh\nprintf 'Ss   \\377\\376 garbage\\n'\n")
    liveness, why = local_liveness(os.getpid(), START)
    assert liveness is Liveness.UNKNOWN and "cannot read" in why


def test_a_ps_that_cannot_be_run_is_unknown_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_env(tmp_path, monkeypatch, None)
    liveness, why = local_liveness(os.getpid(), START)
    assert liveness is Liveness.UNKNOWN and why.startswith("cannot run ps") and "ermission" in why
