"""`mlx-medic probe`: one real probe from this node, one JSON line, the verdict in the
exit status (0 up, 1 down, 3 inconclusive, 2 bad arguments)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.cli import main
from mlx_medic.health import _lock_file_name
from testbed import free_port
from tests.exporter.probe_servers import CountingCompletionServer

REPO = Path(__file__).resolve().parents[1]


def probe(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    """(exit status, the JSON line or {}, stderr) of `mlx-medic probe ARGS`, in process."""
    try:
        status = main(["probe", *args])
    except SystemExit as exc:  # argparse rejects a bad command line this way
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) <= 1, f"more than one line on stdout: {out!r}"
    return status, json.loads(lines[0]) if lines else {}, err


def test_a_serving_model_is_up_with_exit_status_0_and_one_json_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with CountingCompletionServer() as server:
        status, answer, _ = probe(capsys, "--host", "127.0.0.1", "--port", str(server.port))
    assert status == 0
    assert set(answer) == {"up", "conclusive", "reason", "latency_seconds"}
    assert answer["up"] is True and answer["conclusive"] is True
    assert "completed a 1-token request" in answer["reason"]
    assert answer["latency_seconds"] >= 0
    assert server.requests == 1  # a real completion, exactly one


def test_a_closed_port_is_down_with_exit_status_1_and_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    status, answer, _ = probe(capsys, "--host", "127.0.0.1", "--port", str(port))
    assert status == 1
    assert answer["up"] is False and answer["conclusive"] is True
    assert f"connection refused: nothing listens on 127.0.0.1:{port}" == answer["reason"]


def test_a_server_that_answers_without_a_completion_is_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with CountingCompletionServer(status=500) as server:
        status, answer, _ = probe(capsys, "--host", "127.0.0.1", "--port", str(server.port))
    assert status == 1 and answer["up"] is False
    assert "HTTP 500" in answer["reason"]


def test_a_probe_that_cannot_take_the_node_wide_lock_is_inconclusive_with_exit_status_3(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    with CountingCompletionServer() as server:
        # Another process (the exporter, say) is probing the same server right now.
        fd = os.open(
            lock_dir / _lock_file_name("127.0.0.1", server.port), os.O_RDWR | os.O_CREAT, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            status, answer, _ = probe(
                capsys,
                "--host",
                "127.0.0.1",
                "--port",
                str(server.port),
                "--timeout",
                "0.2",
                "--lock-dir",
                str(lock_dir),
            )
        finally:
            os.close(fd)
        assert server.requests == 0  # nothing was sent beside the other probe
    assert status == 3
    assert answer["up"] is False and answer["conclusive"] is False
    assert answer["reason"].startswith("not probed: another probe of 127.0.0.1:")


def test_the_lock_dir_is_created_when_missing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    lock_dir = tmp_path / "state" / "locks"
    with CountingCompletionServer() as server:
        status, _, _ = probe(
            capsys, "--host", "127.0.0.1", "--port", str(server.port), "--lock-dir", str(lock_dir)
        )
    assert status == 0
    assert (lock_dir / _lock_file_name("127.0.0.1", server.port)).exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--port", "8080"], "the following arguments are required: --host"),
        (["--host", "127.0.0.1"], "the following arguments are required: --port"),
        (["--host", "127.0.0.1", "--port", "http"], "'http' is not a port number"),
        (["--host", "127.0.0.1", "--port", "0"], "0 is not a TCP port (1-65535)"),
        (["--host", "127.0.0.1", "--port", "65536"], "65536 is not a TCP port (1-65535)"),
        (
            ["--host", "127.0.0.1", "--port", "80", "--timeout", "-1"],
            "'-1' must be a positive number of seconds",
        ),
        (
            ["--host", "127.0.0.1", "--port", "80", "--timeout", "nan"],
            "'nan' must be a positive number of seconds",
        ),
        (["--host", "a b", "--port", "80"], "probe host 'a b' is not a host name or address"),
    ],
)
def test_bad_arguments_exit_2_with_a_message_that_names_the_problem_and_probe_nothing(
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    problem: str,
) -> None:
    status, answer, err = probe(capsys, *args)
    assert status == 2
    assert answer == {}
    assert problem in err


def test_an_unusable_lock_dir_exits_2_and_names_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    status, answer, err = probe(
        capsys, "--host", "127.0.0.1", "--port", "80", "--lock-dir", str(not_a_dir / "locks")
    )
    assert status == 2 and answer == {}
    assert f"cannot use --lock-dir {not_a_dir / 'locks'}" in err


def test_the_installed_command_prints_the_same_line_as_a_subprocess() -> None:
    """What a person or a script runs on a node: the console entry point, stdout only JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with CountingCompletionServer() as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_medic.cli",
                "probe",
                "--host",
                "127.0.0.1",
                "--port",
                str(server.port),
                "--timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["up"] is True
