"""The service helper asks supervisord over its unix socket what `supervisorctl -c CONFIG
stop|start|restart NAME` asks, and reads the answers as supervisorctl does: a stop of a
stopped program and a start of a running one succeed, anything else refused is a failure
in supervisorctl's own words, and a socket that does not answer is no answer.

Each test runs its own supervisord (Debian's) on this host, its socket, config and logs
in the test's tmp dir, and ends it by pid."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlx_medic.inventory.model import Service
from mlx_medic.node.service_cli import supervisord_socket
from mlx_medic.platform.supervisord_config import SupervisorSocket, socket_of
from mlx_medic.platform.supervisord_rpc import ask_supervisord
from tests.tools import require_tool

CONF = """\
[unix_http_server]
file=%(here)s/s.sock
{auth}
[supervisord]
pidfile=%(here)s/supervisord.pid
logfile=%(here)s/supervisord.log
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://%(here)s/s.sock ; the same socket
{auth}
[program:tiny]
command=sleep 100000
startsecs=0
[program:stubborn]
command=sh -c 'trap "" TERM; exec sleep 100000'
startsecs=0
stopwaitsecs=3
autostart=false
"""


@dataclass
class Supervisord:
    conf: Path
    socket: SupervisorSocket

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["supervisorctl", "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def pid(self) -> str:
        return self.ctl("pid", "tiny").stdout.strip()


def start_supervisord(directory: Path, auth: str = "") -> Iterator[Supervisord]:
    require_tool("supervisord")
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "supervisord.conf"
    conf.write_text(CONF.format(auth=auth))
    daemon = subprocess.Popen(
        ["supervisord", "-n", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        where = socket_of(conf)
        assert where is not None
        running = Supervisord(conf, where)
        deadline = time.monotonic() + 30
        while "RUNNING" not in running.ctl("status", "tiny").stdout:
            assert time.monotonic() < deadline, "supervisord did not start its program"
            time.sleep(0.1)
        yield running
    finally:
        daemon.terminate()  # supervisord stops its program, then itself
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)


@pytest.fixture
def supervisord(tmp_path: Path) -> Iterator[Supervisord]:
    yield from start_supervisord(tmp_path / "sup")


def test_stop_and_start_answer_as_supervisorctl_does(supervisord: Supervisord) -> None:
    where = supervisord.socket
    assert ask_supervisord(where, "stop", "tiny", 30) == (0, "tiny: stopped\n", "")
    assert "STOPPED" in supervisord.ctl("status", "tiny").stdout
    # stopped already: supervisorctl says so and exits 0, and so does the helper
    again = supervisord.ctl("stop", "tiny")
    assert (again.returncode, again.stdout) == (0, "tiny: ERROR (not running)\n")
    assert ask_supervisord(where, "stop", "tiny", 30) == (0, again.stdout, "")

    assert ask_supervisord(where, "start", "tiny", 30) == (0, "tiny: started\n", "")
    assert "RUNNING" in supervisord.ctl("status", "tiny").stdout
    running = supervisord.ctl("start", "tiny")
    assert (running.returncode, running.stdout) == (0, "tiny: ERROR (already started)\n")
    assert ask_supervisord(where, "start", "tiny", 30) == (0, running.stdout, "")


def test_restart_stops_then_starts_a_new_process(supervisord: Supervisord) -> None:
    before = supervisord.pid()
    answer = ask_supervisord(supervisord.socket, "restart", "tiny", 30)
    assert answer == (0, "tiny: stopped\ntiny: started\n", "")
    assert supervisord.pid() not in ("", "0", before)


def test_a_program_supervisord_does_not_know_is_a_failure_in_its_words(
    supervisord: Supervisord,
) -> None:
    ctl = supervisord.ctl("stop", "other")
    assert ctl.returncode != 0 and ctl.stdout == "other: ERROR (no such process)\n"
    answer = ask_supervisord(supervisord.socket, "stop", "other", 30)
    assert answer == (1, ctl.stdout, "supervisord: BAD_NAME: other\n")


def test_a_stop_that_outlasts_the_timeout_is_no_answer(supervisord: Supervisord) -> None:
    assert ask_supervisord(supervisord.socket, "start", "stubborn", 30)[0] == 0
    # it ignores SIGTERM: supervisord waits its stopwaitsecs (3 s) before SIGKILL
    answer = ask_supervisord(supervisord.socket, "stop", "stubborn", 1)
    assert answer == (None, "", f"{supervisord.socket.url} did not answer within 1s\n")


def test_a_socket_nobody_serves_is_no_answer(tmp_path: Path) -> None:
    gone = SupervisorSocket(tmp_path / "gone.sock")
    status, stdout, stderr = ask_supervisord(gone, "stop", "tiny", 5)
    assert (status, stdout) == (None, "")
    assert stderr.startswith(f"unix://{tmp_path}/gone.sock: ") and "No such file" in stderr


def test_the_sections_credentials_are_sent_and_wrong_ones_refused(tmp_path: Path) -> None:
    for running in start_supervisord(tmp_path / "auth", "username=medic\npassword=p@ss:w;rd"):
        assert running.socket.username == "medic"
        # `;` starts a comment only after a space: supervisorctl logs in with the same
        assert running.socket.password == "p@ss:w;rd"
        assert ask_supervisord(running.socket, "stop", "tiny", 30)[0] == 0
        wrong = SupervisorSocket(running.socket.path, "medic", "nope")
        status, _, stderr = ask_supervisord(wrong, "start", "tiny", 30)
        assert status is None and "401 Unauthorized" in stderr
        assert "STOPPED" in running.ctl("status", "tiny").stdout


def test_the_socket_is_read_from_the_config_as_supervisorctl_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def config(text: str) -> SupervisorSocket | None:
        path = tmp_path / "s.conf"
        path.write_text(text)
        return socket_of(path)

    monkeypatch.setenv("SUP_DIR", "/run/sup")
    assert config("[supervisorctl]\nserverurl=unix://%(ENV_SUP_DIR)s/x.sock\n") == (
        SupervisorSocket(Path("/run/sup/x.sock"))
    )
    assert config("[supervisorctl]\nserverurl=unix://%(here)s/../y.sock # here\n") == (
        SupervisorSocket(Path(tmp_path.parent / "y.sock"))
    )
    # what it does not follow names no socket: supervisorctl runs and says what is wrong
    assert config("[supervisorctl]\nserverurl=http://127.0.0.1:9001\n") is None
    assert config("[supervisorctl]\n") is None  # supervisorctl's default is http
    assert config("[supervisord]\n") is None
    assert config("[supervisorctl]\nserverurl=unix://%(ENV_NOT_SET_HERE)s/z.sock\n") is None
    assert config("not an ini file\n") is None
    assert socket_of(tmp_path / "missing.conf") is None


def test_only_supervisord_without_sudo_and_with_a_config_is_asked_directly(
    supervisord: Supervisord,
) -> None:
    def service(**fields: object) -> Service:
        return Service.model_validate({"manager": "supervisord", "label": "tiny", **fields})

    assert supervisord_socket(service(config=str(supervisord.conf))) == supervisord.socket
    assert supervisord_socket(service(config=str(supervisord.conf), sudo=True)) is None
    assert supervisord_socket(service()) is None  # supervisorctl finds its own default
    launchd = Service.model_validate({"manager": "launchd", "label": "com.x.tiny"})
    assert supervisord_socket(launchd) is None
