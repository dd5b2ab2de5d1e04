"""`mlx-medic node lock` and `pid-alive`: the model lock's file on the head changes only by
compare-then-write (take when free, replace and release while it holds your token, break
while it is exactly what was judged stale), and a pid is judged on its own node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from mlx_medic.state.model_lock_file import LockInfo, text_digest
from tests.node.helper_runner import Helpers, two_model_helpers


def info(token: str, run_id: str = "r1") -> str:
    lock = LockInfo(
        node="n1",
        pid=os.getpid(),
        pid_start=None,
        host="h",
        time=1.0,
        holder="remediator",
        run_id=run_id,
        expires=2.0,
        token=token,
    )
    return lock.to_json()


@pytest.fixture
def helpers(tmp_path: Path) -> Helpers:
    return two_model_helpers(tmp_path)


def lock_file(helpers: Helpers) -> Path:
    return helpers.state / "locks" / "m1.lock"


def test_take_creates_the_lock_only_when_there_is_none(helpers: Helpers) -> None:
    assert helpers.document("lock", "m1", "show")["text"] is None
    taken = helpers.document("lock", "m1", "take", "--info", info("a"))
    assert taken["done"] and LockInfo.parse(taken["text"]).token == "a"
    refused = helpers.document("lock", "m1", "take", "--info", info("b", "r2"), status=1)
    assert not refused["done"] and LockInfo.parse(refused["text"]).token == "a"  # the holder
    assert LockInfo.parse(lock_file(helpers).read_text()).token == "a"


def test_replace_and_release_act_only_while_the_lock_holds_the_callers_token(
    helpers: Helpers,
) -> None:
    helpers.document("lock", "m1", "take", "--info", info("a"))
    renewed = json.loads(info("a")) | {"expires": 99.0}
    helpers.document(
        "lock", "m1", "replace", "--expected-token", "b", "--info", json.dumps(renewed), status=1
    )
    assert LockInfo.parse(lock_file(helpers).read_text()).expires == 2.0
    helpers.document(
        "lock", "m1", "replace", "--expected-token", "a", "--info", json.dumps(renewed)
    )
    assert LockInfo.parse(lock_file(helpers).read_text()).expires == 99.0
    assert not helpers.document("lock", "m1", "release", "--token", "b", status=1)["done"]
    assert lock_file(helpers).exists()
    assert helpers.document("lock", "m1", "release", "--token", "a")["text"] is None
    assert helpers.document("lock", "m1", "release", "--token", "a")["done"]  # none: done
    helpers.document(
        "lock", "m1", "replace", "--expected-token", "a", "--info", info("a"), status=1
    )
    assert not lock_file(helpers).exists()  # a lost lock is never written back


def test_break_removes_only_the_lock_text_that_was_judged_stale(helpers: Helpers) -> None:
    helpers.document("lock", "m1", "take", "--info", info("a"))
    judged = lock_file(helpers).read_text()
    helpers.document(
        "lock", "m1", "break", "--expected-sha256", text_digest(judged + " "), status=1
    )
    assert lock_file(helpers).exists()
    assert helpers.document("lock", "m1", "break", "--expected-sha256", text_digest(judged))["done"]
    assert not lock_file(helpers).exists()


def test_of_many_concurrent_takers_exactly_one_wins_and_nothing_is_left_beside_it(
    helpers: Helpers,
) -> None:
    argv = [sys.executable, "-m", "mlx_medic.cli", "node", "lock", "m1", "take", "--info"]
    tail = ["--inventory", str(helpers.config), "--node", "n1", "--json"]
    takers = [
        subprocess.Popen(
            [*argv, info(f"t{i}"), *tail], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(8)
    ]
    results = [(taker.wait(timeout=120), json.loads(taker.communicate()[0])) for taker in takers]
    winners = [document for status, document in results if status == 0]
    assert len(winners) == 1 and all(doc["done"] is (doc in winners) for _, doc in results)
    token = LockInfo.parse(lock_file(helpers).read_text()).token
    assert all(LockInfo.parse(doc["text"]).token == token for _, doc in results)
    assert sorted(p.name for p in lock_file(helpers).parent.iterdir()) == [
        "m1.lock",
        "m1.lock.guard",
    ]


def test_a_lock_lives_only_on_the_models_head_and_its_info_must_be_a_lock(
    helpers: Helpers,
) -> None:
    peer = helpers.run("lock", "m1", "show", node="n2")
    assert peer.returncode == 2 and "its head n1, not on n2" in peer.stderr
    bad = helpers.run("lock", "m1", "take", "--info", '{"pid": 1}')
    assert bad.returncode == 2 and "--info is not a lock" in bad.stderr
    tokenless = helpers.run("lock", "m1", "take", "--info", info(""))
    assert tokenless.returncode == 2 and "token" in tokenless.stderr
    assert not lock_file(helpers).exists()


def test_a_symlink_planted_as_the_lock_is_never_followed(helpers: Helpers, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    lock_file(helpers).parent.mkdir(parents=True)
    lock_file(helpers).symlink_to(target)
    result = helpers.run("lock", "m1", "show")
    assert result.returncode == 1 and "symlink" in result.stderr
    assert helpers.run("lock", "m1", "release", "--token", "a").returncode == 1
    assert target.read_text() == "precious"


def test_pid_alive_judges_a_pid_and_its_start_time_on_this_node(helpers: Helpers) -> None:
    me = os.getpid()
    started = psutil.Process(me).create_time()
    alive = helpers.document("pid-alive", str(me), "--start-time", repr(started))
    assert (alive["pid"], alive["liveness"]) == (me, "alive")
    reused = helpers.document("pid-alive", str(me), "--start-time", repr(started - 3600))
    assert reused["liveness"] == "reused"
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert helpers.document("pid-alive", str(gone.pid))["liveness"] == "dead"
    assert helpers.run("pid-alive", "0").returncode == 2
