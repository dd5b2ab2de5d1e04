"""A node helper's time limit (`--time-limit SECONDS`, which NodeHelpers sends with every
call: the caller's own wait): past it the helper ends itself and every process it
started, because a caller that stops waiting ends nothing on the node (sshd signals no
command without a terminal)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed import processes

NODE = (sys.executable, "-m", "mlx_medic.cli", "node")
LIMIT = ("--json", "--time-limit", "30")

# A helper (the real `mlx-medic node ledger` command line) whose work is waiting on a
# child of its own that never ends, as a helper stuck on a hung command; it writes the
# child's pid to the file given first.
HANGS = """
import subprocess, sys
from mlx_medic.node import ledger_cli

def hang(args):
    child = subprocess.Popen(["sleep", "600"])
    open(sys.argv[1], "w").write(str(child.pid))
    return child.wait()

ledger_cli.run = hang
from mlx_medic.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_hung_helper_ends_itself_and_its_child_at_its_time_limit(tmp_path: Path) -> None:
    child_pid = tmp_path / "child"
    started = time.monotonic()
    helper = subprocess.Popen(
        [sys.executable, "-c", HANGS, str(child_pid), "node", "ledger", "--time-limit", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = helper.communicate(timeout=20)
    finally:
        helper.kill()
    took = time.monotonic() - started
    assert helper.returncode == -signal.SIGKILL, stderr
    assert 1 <= took < 10, took
    assert "mlx-medic node ledger: its time limit (1s) passed: ending it" in stderr
    child = int(child_pid.read_text())
    assert processes.wait_gone([child], timeout=5) == []  # its child went with it


def test_a_helper_within_its_time_limit_answers_as_without_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [*NODE, "pid-alive", "1", "--node", "n1", "--state-dir", str(tmp_path), *LIMIT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_a_time_limit_that_is_not_a_positive_number_is_refused_naming_it() -> None:
    for value in ("0", "-1", "soon", "nan", "inf"):
        done = subprocess.run(
            [*NODE, "ledger", "--time-limit", value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (value, done.stderr)
        assert f"{value!r} is not a positive number of seconds" in done.stderr, done.stderr
