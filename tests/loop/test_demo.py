"""`scripts/demo.sh --short`, as a person runs it: it narrates the seed's fault against
mlx-medic and against the seed's first fix, the model answers again under mlx-medic, and
nothing of the testbed is left afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.loop.leftovers import processes_naming
from tests.tools import require_root, require_tool

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_short_demo_narrates_the_loop_the_model_answers_and_nothing_is_left():
    require_root()
    for tool in ("sshd", "supervisord", "prometheus", "prometheus-alertmanager"):
        require_tool(tool)
    result = subprocess.run(
        [str(REPO / "scripts" / "demo.sh"), "--short"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    ours = out[
        out.index("mlx-medic (serve + remediator): the loop stands") : out.index(
            "the seed's first fix: the loop stands"
        )
    ]
    assert "FAULT 1: mlx.launch and the head's rank SIGKILLed together" in ours
    after_fault = ours[ours.index("FAULT 1") :]
    assert "the model answers" in after_fault  # back by itself
    assert "protection domains in use:" in ours and "orphans (exporters):" in ours
    assert "Prometheus http://127.0.0.1:" in ours and "the on-call page http://127.0.0.1:" in ours
    assert "side by side" in out and "the seed's first fix" in out.split("side by side")[1]
    (workdir,) = re.findall(r"cleaned up: (/var/tmp/mlx-medic-demo-[0-9a-f]+) removed", out)
    assert not Path(workdir).exists()
    assert processes_naming(workdir) == []
    assert workdir not in Path("/proc/self/mountinfo").read_text()


def test_ctrl_c_twice_while_the_loop_stands_still_cleans_up_everything():
    """A terminal's Ctrl-C reaches the whole foreground process group; the second one
    comes while the demo cleans up, and is said and ignored."""
    require_root()
    for tool in ("sshd", "supervisord", "prometheus", "prometheus-alertmanager"):
        require_tool(tool)
    demo = subprocess.Popen(
        [str(REPO / "scripts" / "demo.sh"), "--short"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    seen: list[str] = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if "the loop stands" in line:
                break
        else:
            raise AssertionError("".join(seen)[-3000:])
        os.killpg(demo.pid, signal.SIGINT)
        time.sleep(1.0)
        with contextlib.suppress(ProcessLookupError):  # the cleanup may be done already
            os.killpg(demo.pid, signal.SIGINT)
        out = "".join(seen) + demo.stdout.read()
        assert demo.wait(timeout=300) == 130, out[-3000:]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert "interrupted: cleaning up" in out
    (workdir,) = re.findall(r"cleaned up: (/var/tmp/mlx-medic-demo-[0-9a-f]+) removed", out)
    assert not Path(workdir).exists()
    assert processes_naming(workdir) == []
    assert workdir not in Path("/proc/self/mountinfo").read_text()
