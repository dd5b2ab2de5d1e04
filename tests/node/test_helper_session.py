"""A helper session (`mlx-medic node session`) runs many helpers in one login: each request
in a child forked for it, answered as that helper run alone would answer, at once and
independently of the others; it ends when its client goes, and asks for a new session
when mlx-medic changed under it."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.inventories import MEDIC, two_models

# A session whose requests are small programs, to show the session's own behaviour.
FAKE_SESSION = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    from pathlib import Path
    from mlx_medic.node.cli import end_at_time_limit
    from mlx_medic.node.session import HelperSession

    def run(argv):
        what, *rest = argv
        if what == "sleep":
            time.sleep(float(rest[0]))
            print("slept", rest[0])
        elif what == "hang-past-limit":
            end_at_time_limit(float(rest[0]), "hang")
            time.sleep(60)
        elif what == "big":
            sys.stdout.write("x" * int(rest[0]))
        elif what == "daemon":
            sleeper = subprocess.Popen(["sleep", "30"])  # holds the child's stdout
            Path(rest[0]).write_text(str(sleeper.pid))
            print("left a daemon")
        elif what == "group":
            print(os.getpgrp(), os.getpid(), os.getppid())
        elif what == "exit":
            print("err", file=sys.stderr)
            sys.exit(int(rest[0]))
        elif what == "raise":
            raise RuntimeError("boom")
        return 0

    sys.exit(HelperSession(run, "test", watched=[Path(sys.argv[1])]).serve())
    """
)


class Session:
    """A session process: requests in, replies out, one JSON line each."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.buffer = b""
        self.hello = self.receive()

    def send(self, request: dict[str, Any] | str) -> None:
        line = request if isinstance(request, str) else json.dumps(request)
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 30) -> dict[str, Any]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no reply within {timeout}s"
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 65536)
                assert data, f"the session ended: {self.stderr()}"
                self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def replies(self, count: int, timeout: float = 30) -> dict[Any, dict[str, Any]]:
        return {reply["id"]: reply for reply in (self.receive(timeout) for _ in range(count))}

    def close(self, timeout: float = 30) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout)

    def stderr(self) -> str:
        if self.process.poll() is None:
            return ""
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Session]:
    stamp = tmp_path / "code-stamp"
    stamp.write_text("v1")
    session = Session([sys.executable, "-c", FAKE_SESSION, str(stamp)])
    yield session
    if session.process.poll() is None:
        session.process.kill()
        session.process.wait()


def test_the_session_says_hello_with_its_protocol_version_and_pid(fake: Session) -> None:
    assert fake.hello == {"session": 1, "version": "test", "pid": fake.process.pid}


def test_each_reply_carries_the_requests_exit_status_stdout_and_stderr(fake: Session) -> None:
    fake.send({"id": 1, "argv": ["exit", "3"]})
    fake.send({"id": 2, "argv": ["raise"]})
    replies = fake.replies(2)
    assert replies[1] == {
        "id": 1,
        "exit_status": 3,
        "signal": None,
        "stdout": "",
        "stderr": "err\n",
    }
    assert replies[2]["exit_status"] == 1 and "RuntimeError: boom" in replies[2]["stderr"]


def test_requests_run_at_once_and_a_slow_one_holds_up_no_other(fake: Session) -> None:
    fake.send({"id": 1, "argv": ["sleep", "3"]})
    fake.send({"id": 2, "argv": ["sleep", "0"]})
    first = fake.receive()
    assert first["id"] == 2 and first["stdout"] == "slept 0\n"
    assert fake.receive()["id"] == 1


def test_each_request_runs_in_a_process_group_of_its_own_under_the_session(
    fake: Session,
) -> None:
    fake.send({"id": 1, "argv": ["group"]})
    group, pid, parent = map(int, fake.receive()["stdout"].split())
    assert group == pid and parent == fake.process.pid


def test_a_request_past_its_time_limit_is_ended_and_the_session_serves_on(fake: Session) -> None:
    fake.send({"id": 1, "argv": ["hang-past-limit", "0.5"]})
    reply = fake.receive()
    assert reply["exit_status"] is None and reply["signal"] == signal.SIGKILL
    assert "its time limit (0.5s) passed" in reply["stderr"]
    fake.send({"id": 2, "argv": ["exit", "0"]})
    assert fake.receive()["exit_status"] == 0


def test_output_larger_than_a_pipe_comes_back_whole(fake: Session) -> None:
    fake.send({"id": 1, "argv": ["big", str(3 << 20)]})
    assert len(fake.receive()["stdout"]) == 3 << 20


def test_a_process_left_holding_a_childs_output_does_not_hold_up_its_reply(
    fake: Session, tmp_path: Path
) -> None:
    pid_file = tmp_path / "daemon.pid"
    fake.send({"id": 1, "argv": ["daemon", str(pid_file)]})
    try:
        reply = fake.receive(timeout=10)  # the daemon sleeps 30 s on the child's stdout
        assert reply["stdout"] == "left a daemon\n"
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_line_that_is_not_a_request_is_answered_with_an_error_and_runs_nothing(
    fake: Session,
) -> None:
    fake.send("not json")
    fake.send({"argv": ["exit", "0"]})
    fake.send({"id": 4, "argv": "exit 0"})
    fake.send({"id": 5, "argv": []})
    answers = [fake.receive() for _ in range(4)]
    assert [a.get("id") for a in answers] == [None, None, 4, 5]
    assert all("error" in a and "exit_status" not in a for a in answers)
    assert "not JSON" in answers[0]["error"] and "integer id" in answers[1]["error"]
    fake.send({"id": 6, "argv": ["exit", "0"]})
    assert fake.receive()["exit_status"] == 0


def test_when_its_client_goes_it_ends_after_its_running_requests_replied(fake: Session) -> None:
    fake.send({"id": 1, "argv": ["sleep", "1"]})
    assert fake.close() == 0
    assert fake.receive()["stdout"] == "slept 1\n"


def test_when_mlx_medic_changes_under_it_every_request_is_sent_back_not_run(
    fake: Session, tmp_path: Path
) -> None:
    fake.send({"id": 1, "argv": ["sleep", "1"]})
    fake.send({"id": 2, "argv": ["exit", "0"]})
    assert fake.receive()["id"] == 2  # so 1 runs already
    (tmp_path / "code-stamp").unlink()  # an upgrade rewrites the package's files
    (tmp_path / "code-stamp").write_text("v2")
    fake.send({"id": 3, "argv": ["exit", "0"]})
    fake.send({"id": 4, "argv": ["exit", "0"]})
    replies = fake.replies(3)
    assert replies[3] == {"id": 3, "retry": "mlx-medic changed on this node"}
    assert replies[4] == {"id": 4, "retry": "mlx-medic changed on this node"}
    assert replies[1]["stdout"] == "slept 1\n"  # what was running finished and replied
    assert fake.close() == 0  # the client closes it: a new session runs the new code


# --- the real helpers ------------------------------------------------------------------------
@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(two_models(str(tmp_path / "state")))
    return path


def helper_words(inventory: Path, *words: str, node: str = "n1") -> list[str]:
    return ["mlx-medic", "node", *words, "--inventory", str(inventory), "--node", node, "--json"]


def unstamped(log: str) -> list[str]:
    """Log lines without their time stamps."""
    return [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", "", line) for line in log.splitlines()]


def test_a_helper_answers_in_a_session_as_it_answers_run_alone(
    inventory: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    session = Session([MEDIC, "node", "session", "--inventory", str(inventory)], env)
    requests = [
        ["run", "m1", "show"],
        ["lock", "m1", "show"],
        ["backend", "m1", "show"],
        ["drain", "show"],
        ["sweep", "m1", "--dry-run"],
        ["clean", "m1", "--dry-run"],
        ["run", "no-such-model", "show"],
    ]
    for number, words in enumerate(requests):
        session.send({"id": number, "argv": helper_words(inventory, *words)})
    replies = session.replies(len(requests), timeout=60)
    assert session.close() == 0
    for number, words in enumerate(requests):
        alone = subprocess.run(
            [MEDIC, *helper_words(inventory, *words)[1:]],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        reply = replies[number]
        assert reply["exit_status"] == alone.returncode, words
        assert unstamped(reply["stderr"]) == unstamped(alone.stderr), words
        if words[0] in ("sweep", "clean"):  # what they saw differs by the pids they ran as
            assert json.loads(reply["stdout"]).keys() == json.loads(alone.stdout).keys()
        else:
            assert reply["stdout"] == alone.stdout, words


def test_a_session_runs_node_helpers_only_never_another_session(inventory: Path) -> None:
    session = Session([MEDIC, "node", "session", "--inventory", str(inventory)])
    session.send({"id": 1, "argv": ["mlx-medic", "node", "session", "--inventory", "x"]})
    session.send({"id": 2, "argv": ["mlx-medic", "exporter"]})
    replies = session.replies(2)
    session.close()
    for reply in replies.values():
        assert reply["exit_status"] == 2
        assert "not a node helper this session runs" in reply["stderr"]


def test_its_children_import_nothing_of_the_helpers_the_session_has_not_loaded(
    inventory: Path, tmp_path: Path
) -> None:
    """Each helper run after the session's preload imports no module: a child starts
    warm. (The first read of an inventory validates it in full, once per file: done
    before, as a node's first helper does it.)"""
    probe = textwrap.dedent(
        f"""\
        import contextlib, io, json, sys
        from mlx_medic.cli import main
        from mlx_medic.node.session_cli import preload
        common = ["--inventory", {str(inventory)!r}, "--node", "n1", "--json"]
        with contextlib.redirect_stdout(io.StringIO()):
            main(["node", "run", "m1", "show", *common])  # validates and snapshots it
        preload()
        new = {{}}
        for words in (
            ["run", "m1", "show"], ["sweep", "m1", "--dry-run"], ["orphans", "m1"],
            ["facts", "m1"], ["probe", "m1", "--timeout", "1"], ["lock", "m1", "show"],
            ["ledger"], ["clean", "m1", "--dry-run"], ["room", "m1"],
            ["service", "m1", "status"], ["backend", "m1", "show"], ["pid-alive", "1"],
            ["drain", "show"],
        ):
            before = set(sys.modules)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(
                io.StringIO()
            ):
                try:
                    main(["node", *words, *common])
                except SystemExit:
                    pass
            new[words[0]] = sorted(set(sys.modules) - before)
        print(json.dumps(new))
        """
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    imported = json.loads(out.stdout)
    assert len(imported) == 13 and imported == {helper: [] for helper in imported}


# --- through a key's forced command -----------------------------------------------------------
def forced_session(inventory: Path, key: str, node: str, tmp_path: Path) -> Session:
    """A session as sshd starts one for a pinned key: the forced command with the
    client's line in SSH_ORIGINAL_COMMAND."""
    line = f"mlx-medic node session --inventory {inventory} --node {node}"
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": line, "XDG_CACHE_HOME": str(tmp_path / "c")}
    command = [MEDIC, "node", "forced-command", "--inventory", str(inventory), "--key", key]
    return Session([*command, "--node", node], env)


def test_through_a_forced_command_each_request_is_checked_against_the_keys_table(
    inventory: Path, tmp_path: Path
) -> None:
    session = forced_session(inventory, "serve", "n2", tmp_path)  # m1's peer
    session.send({"id": 1, "argv": helper_words(inventory, "pid-alive", "1", node="n2")})
    session.send({"id": 2, "argv": helper_words(inventory, "facts", "m1", node="n2")})
    session.send({"id": 3, "argv": ["mlx-medic", "node", "session", "--inventory", str(inventory)]})
    session.send({"id": 4, "argv": ["sh", "-c", "id"]})
    replies = session.replies(4)
    assert session.close() == 0
    assert replies[1]["exit_status"] == 0 and json.loads(replies[1]["stdout"])["pid"] == 1
    for number, why in (
        (2, "'node facts' is not allowed for the serve key"),
        (3, "a helper session runs helpers, not another session"),
        (4, "'sh' is not mlx-medic"),
    ):
        assert replies[number]["exit_status"] == 2, number
        assert replies[number]["stderr"].startswith("mlx-medic forced command: refused"), number
        assert why in replies[number]["stderr"], number


def test_a_key_without_the_session_grant_is_refused_a_session_as_any_other_helper(
    inventory: Path, tmp_path: Path
) -> None:
    line = f"mlx-medic node session --inventory {inventory} --node n1 --json"
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": line, "XDG_CACHE_HOME": str(tmp_path / "c")}
    refused = subprocess.run(
        [MEDIC, "node", "forced-command", "--inventory", str(inventory), "--node", "n1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert "refused" in refused.stderr and "--json" in refused.stderr


def test_without_an_inventory_a_session_does_not_start() -> None:
    refused = subprocess.run(
        [MEDIC, "node", "session"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert "--inventory FILE is required" in refused.stderr
