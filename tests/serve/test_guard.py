"""The rank guard: a process started under it is ended once its run's lease runs out or
the node's current run moves on; its watcher is never taken for a rank."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from mlx_medic.processes.info import ENV_RANK, ENV_RUN_ID
from mlx_medic.serve.guard import guard_argv, parse_args, run_is_over, watch
from mlx_medic.state.ledger import read_ledger
from mlx_medic.state.node_identity import write_node_id
from mlx_medic.state.runs import record_current_run, record_lease


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g}s")
        time.sleep(0.1)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def watchers_of(run_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "--watch" in cmdline and run_id in cmdline:
            found.append(proc)
    return found


@pytest.fixture
def guarded(tmp_path: Path):
    """Start `sleep` under the guard for a fresh run with a lease of 60s; yield its parts."""
    state = tmp_path / "state"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    write_node_id(state, "n1")
    record_current_run(state, "m1", run_id)
    record_lease(state, "m1", run_id, 60.0, "test")
    started: list[subprocess.Popen[bytes]] = []

    def start(
        backend: str = "ring",
        grace: float = 0.5,
        command: tuple[str, ...] = ("-c", "import time; time.sleep(600)"),
    ):
        argv = guard_argv(
            sys.executable,
            model="m1",
            run_id=run_id,
            state_dir=state,
            grace=grace,
            sigkill=True,
            backend=backend,
            python_args=True,
        )
        env = {**os.environ, ENV_RANK: "0", ENV_RUN_ID: run_id}
        popen = subprocess.Popen([*argv, *command], env=env)
        started.append(popen)
        wait_for(lambda: len(watchers_of(run_id)) == 1, what="the watcher")
        return popen

    yield state, run_id, start
    for popen in started:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
    for watcher in watchers_of(run_id):
        watcher.kill()


def test_the_guard_becomes_the_command_itself_and_leaves_it_alone_while_the_lease_holds(guarded):
    _state, _run_id, start = guarded
    rank = start()
    time.sleep(2.5)  # a few polls of the watcher
    assert rank.poll() is None
    cmdline = psutil.Process(rank.pid).cmdline()
    assert cmdline[1:3] == ["-c", "import time; time.sleep(600)"]  # exec: the same pid


def test_a_lease_that_runs_out_ends_the_rank_and_then_the_watcher(guarded):
    state, run_id, start = guarded
    rank = start()
    record_lease(state, "m1", run_id, 0.5, "a wrapper that was SIGKILLed")
    rank.wait(timeout=30)
    wait_for(lambda: watchers_of(run_id) == [], what="the watcher's exit")
    log = (state / "runs" / "m1.guard.log").read_text()
    assert f"ending pid {rank.pid} of run {run_id}: the lease ran out" in log


def test_a_clock_step_while_the_rank_runs_does_not_blind_its_watcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """On Linux a process's start in seconds since the epoch is the boot time plus its
    start in ticks, so a step of the clock moves it for every later reader. The watcher
    tells its process by the start counted from boot: it still ends the rank."""
    state = tmp_path / "state"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    write_node_id(state, "n1")
    record_current_run(state, "m1", run_id)
    record_lease(state, "m1", run_id, 60.0, "test")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = psutil.Process(rank.pid).create_time()
        args, _ = parse_args(
            [*("--watch", str(rank.pid), "--start", repr(started), "--model", "m1"),
             *("--run", run_id, "--state-dir", str(state), "--grace", "0.5")]
        )  # fmt: skip
        args.pid = args.watch
        watcher = threading.Thread(target=watch, args=(args,), daemon=True)
        watcher.start()
        wait_for(lambda: "watching pid" in capsys.readouterr().out, what="the watch")
        stepped = psutil._psplatform.boot_time() + 2.0  # the clock stepped 2 s forward
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: stepped)
        time.sleep(2.5)  # a few polls
        assert watcher.is_alive() and rank.poll() is None
        record_lease(state, "m1", run_id, 0.1, "a wrapper that was SIGKILLed")
        assert rank.wait(timeout=30) == -15
        watcher.join(timeout=30)
        assert not watcher.is_alive()
    finally:
        rank.kill()
        rank.wait()


def test_a_new_current_run_on_the_node_ends_the_old_runs_rank(guarded):
    state, _run_id, start = guarded
    rank = start()
    record_current_run(state, "m1", "a-newer-run")
    rank.wait(timeout=30)
    assert "the node's current run is a-newer-run" in (state / "runs" / "m1.guard.log").read_text()


def test_a_rank_that_ignores_sigterm_is_sigkilled_and_a_jaccl_ranks_kill_is_a_ledger_spend(
    guarded,
):
    state, _run_id, start = guarded
    ignore = (
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
    )
    rank = start(backend="jaccl", command=ignore)
    pid = rank.pid
    record_current_run(state, "m1", "another-run")
    assert rank.wait(timeout=30) == -9
    wait_for(lambda: read_ledger(state, "n1").debt == 1, what="the ledger spend")
    (entry,) = read_ledger(state, "n1").entries
    assert (entry.kind, entry.pid, entry.model) == ("sigkill", pid, "m1")


def test_the_watcher_carries_neither_the_rank_nor_the_run_variables_and_holds_no_terminal(
    guarded,
):
    """So neither the exporter nor a sweep takes it for a rank of the run."""
    state, run_id, start = guarded
    start()
    (watcher,) = watchers_of(run_id)
    environ = watcher.environ()
    assert ENV_RANK not in environ and ENV_RUN_ID not in environ
    assert os.getsid(watcher.pid) == watcher.pid  # a session of its own
    stdio = [os.readlink(f"/proc/{watcher.pid}/fd/{fd}") for fd in (0, 1, 2)]
    assert stdio == [os.devnull, *[str(state / "runs" / "m1.guard.log")] * 2]


def test_the_lease_verdict_names_why_a_run_is_over(tmp_path: Path):
    assert run_is_over(tmp_path, "m1", "r1", 100.0) == "the node's current run is none, not r1"
    record_current_run(tmp_path, "m1", "r1")
    assert run_is_over(tmp_path, "m1", "r1", 100.0) == "no lease is recorded"
    record_lease(tmp_path, "m1", "r1", 10.0, "serve pid 1 on n1", now=100.0)
    assert run_is_over(tmp_path, "m1", "r1", 105.0) is None
    assert "ran out" in str(run_is_over(tmp_path, "m1", "r1", 111.0))
    record_lease(tmp_path, "m1", "r0", 10.0, "serve pid 1 on n1", now=100.0)
    assert run_is_over(tmp_path, "m1", "r1", 105.0) == "the lease is run r0's"
