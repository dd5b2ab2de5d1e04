"""exo's orphan, for real: a runner whose exo worker was SIGKILLed keeps running
(holding Metal memory and RDMA queue pairs, exo PR 2205) and is reported as an
orphaned exo runner, though its parent is now init."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlx_medic.exporter.collector import sample_value
from mlx_medic.exporter.collectors.processes import ProcessesCollector
from mlx_medic.platform.proc_linux import LinuxProcessTable
from mlx_medic.processes.info import Role

# A stand-in for exo: its main process starts one runner the way exo does
# (multiprocessing, spawn start method) and then waits.
FAKE_EXO = """\
import multiprocessing, sys, time

def runner():
    time.sleep(120)

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    child = multiprocessing.Process(target=runner)
    child.start()
    print(child.pid, flush=True)
    time.sleep(120)
"""


def wait_for(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_a_runner_whose_exo_was_killed_is_reported_as_an_orphaned_exo_runner(tmp_path: Path):
    script = tmp_path / "exo"
    script.write_text(FAKE_EXO)
    exo = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    runner_pid = 0
    try:
        assert exo.stdout is not None
        runner_pid = int(exo.stdout.readline())
        table = LinuxProcessTable()
        collector = ProcessesCollector(
            node="n1",
            inventory=None,
            state_dir=tmp_path,
            table=table,
            clock=time.time,
            established=lambda sshd: True,
        )

        def orphans() -> float | None:
            return sample_value(
                list(collector.collect()),
                "mlx_orphan_processes_by_rule",
                {
                    "model": "exo",
                    "role": "exo_runner",
                    "state": "sleeping",
                    "rule": "launcher_gone",
                },
            )

        def runner_role():
            found = [p for p in table.snapshot() if p.pid == runner_pid]
            return found[0].role if found else None

        assert wait_for(lambda: runner_role() is Role.EXO_RUNNER) is True
        assert not orphans()  # under its live exo: not an orphan

        exo.send_signal(signal.SIGKILL)
        exo.wait(timeout=10)
        # the runner lives on, adopted by an ancestor reaper, and is judged an orphan
        os.kill(runner_pid, 0)
        assert wait_for(lambda: orphans() == 1.0) is True
    finally:
        if exo.poll() is None:
            exo.kill()
            exo.wait(timeout=10)
        if runner_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner_pid, signal.SIGKILL)
