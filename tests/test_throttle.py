"""The testbed's stand-in for launchd's restart throttle: one spawn per interval, a job
that ran longer than the interval restarts at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testbed.throttle import wait_for_turn


def test_a_spawn_waits_out_the_rest_of_the_interval_since_the_last(tmp_path: Path):
    stamp = tmp_path / "stamp"
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    assert wait_for_turn(stamp, 10.0, clock=lambda: now[0], sleep=sleep) == 0.0  # the first
    now[0] += 3.0  # it died after 3 s
    assert wait_for_turn(stamp, 10.0, clock=lambda: now[0], sleep=sleep) == 7.0
    now[0] += 25.0  # it served for a while
    assert wait_for_turn(stamp, 10.0, clock=lambda: now[0], sleep=sleep) == 0.0
    assert slept == [7.0]


def test_the_command_becomes_the_throttled_program(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.throttle",
            "--every",
            "0",
            "--stamp",
            str(tmp_path / "s"),
            "--",
            "sh",
            "-c",
            "echo $$",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip().isdigit()
