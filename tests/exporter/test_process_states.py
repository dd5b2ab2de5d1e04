"""Process states: the /proc letter mapping, and real stopped, zombie and
uninterruptible (cgroup v1 freezer) processes counted by the collector."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_medic.exporter.collector import sample_value
from mlx_medic.exporter.collectors.processes import ProcessesCollector
from mlx_medic.platform.proc_linux import LinuxProcessTable, parse_stat, state_from_letter
from mlx_medic.processes.info import State
from tests.tools import require_root

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_every_proc_state_letter_maps_into_the_closed_set():
    expected = {
        "R": State.RUNNING,
        "S": State.SLEEPING,
        "I": State.SLEEPING,
        "D": State.UNINTERRUPTIBLE,
        "T": State.STOPPED,
        "t": State.STOPPED,
        "Z": State.ZOMBIE,
        "X": State.ZOMBIE,
    }
    for letter, state in expected.items():
        assert state_from_letter(letter) is state
    assert state_from_letter("?") in set(State)


def test_stat_parsing_survives_a_comm_with_spaces_and_parentheses():
    fields = " ".join(["0"] * 17)
    stat = parse_stat(f"42 (my (odd) name) D 7 {fields} 12345 0 0\n".encode())
    assert (stat.comm, stat.state, stat.ppid, stat.starttime) == (
        "my (odd) name",
        State.UNINTERRUPTIBLE,
        7,
        12345,
    )


# --- real processes -------------------------------------------------------------


def _wait_for_state(pid: int, letter: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            if handle.read().rpartition(b")")[2].split()[0].decode() == letter:
                return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never reached state {letter}")


class Ranks:
    """Rank-like children with a unique --model token; every one is killed and reaped."""

    def __init__(self, token: str):
        self.model = f"/var/tmp/mlx-medic-states-{token}"
        self.children: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "--model", self.model],
            env={**os.environ, "MLX_RANK": "0"},
        )
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)


@pytest.fixture
def ranks() -> Iterator[Ranks]:
    started = Ranks(uuid.uuid4().hex[:10])
    try:
        yield started
    finally:
        started.close()


def _counts(collector: ProcessesCollector, model: str) -> dict[State, float]:
    families = list(collector.collect())
    return {
        state: sample_value(
            families, "mlx_processes", {"model": model, "role": "rank", "state": state.value}
        )
        or 0.0
        for state in State
    }


def _collector() -> ProcessesCollector:
    return ProcessesCollector(
        node="here",
        inventory=None,
        state_dir=Path("/nonexistent"),
        table=LinuxProcessTable(),
        clock=time.time,
        established=lambda sshd: None,
    )


def test_a_stopped_rank_is_counted_as_stopped(ranks: Ranks):
    collector = _collector()
    child = ranks.start()
    _wait_for_state(child.pid, "S")
    assert _counts(collector, ranks.model)[State.SLEEPING] == 1
    os.kill(child.pid, signal.SIGSTOP)
    _wait_for_state(child.pid, "T")
    counts = _counts(collector, ranks.model)
    assert counts[State.STOPPED] == 1
    assert counts[State.SLEEPING] == 0


def test_a_rank_never_reaped_is_counted_as_a_zombie(ranks: Ranks):
    collector = _collector()
    child = ranks.start()
    _wait_for_state(child.pid, "S")
    assert _counts(collector, ranks.model)[State.SLEEPING] == 1  # seen alive: argv known
    os.kill(child.pid, signal.SIGKILL)  # and not waited for: it stays a zombie
    _wait_for_state(child.pid, "Z")
    counts = _counts(collector, ranks.model)
    assert counts[State.ZOMBIE] == 1
    assert counts[State.SLEEPING] == 0


def test_a_frozen_rank_is_uninterruptible_and_survives_sigkill_until_thawed(ranks: Ranks):
    require_root()
    from testbed.freezer import available, frozen

    if not available():
        pytest.skip("no cgroup v1 freezer mounted")
    collector = _collector()
    child = ranks.start()
    _wait_for_state(child.pid, "S")
    token = uuid.uuid4().hex[:10]
    with frozen([child.pid], token):
        _wait_for_state(child.pid, "D")
        assert _counts(collector, ranks.model)[State.UNINTERRUPTIBLE] == 1
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.5)
        assert child.poll() is None, "SIGKILL landed on a frozen process"
        assert _counts(collector, ranks.model)[State.UNINTERRUPTIBLE] == 1
    # Thawed: the pending SIGKILL lands (the testbed's "reboot").
    assert child.wait(timeout=10) == -signal.SIGKILL
    assert _counts(collector, ranks.model) == {state: 0.0 for state in State}
