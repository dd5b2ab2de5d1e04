"""The helpers run as the node's login user, not root: another user's look-alike process
or `tmp*` entry is an answer (`not ours`, with its owner), never a crash or a failure; the
run goes on with what it may do, and the remediator's steps say what it could not.

Each test runs the sweep or the clean as a real non-root uid (a forked child after
setresuid, or the helper's command line under setpriv) against what root made: a process
root started with the test's token in its argv, root's entries in a sticky tmp dir. The
uids need no passwd entry. Every scope (dir, port, token) is the test's own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.clean import Cleaner
from mlx_medic.node.sweep import NodeSweep
from mlx_medic.platform.process_table import system_process_table
from mlx_medic.platform.weighers import PythonWeigher, Weigher, default_weigher
from mlx_medic.processes.roles import PatternSet, classifier
from mlx_medic.remediator.outcomes import StepOutcome
from mlx_medic.remediator.steps import CleanTmp, RunContext
from mlx_medic.remediator.steps import Sweep as SweepStep
from mlx_medic.tmp_rules import scope_dirs
from mlx_medic.transport import LocalTransport
from testbed import free_port
from tests.node.test_clean import aged
from tests.remediator.engine_fakes import MODEL, Health, make_inventory
from tests.remediator.fake_helpers import Answer, FakeHelpers
from tests.tools import require_root, require_tool

# Look-alikes only sleep: any Python every user may run (this venv's may sit in /root).
PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)),
    sys.executable,
)


@dataclass
class Scope:
    """One test's own node: a world-traversable base dir (pytest's tmp dirs are root's
    alone), the node user's state dir, a sticky tmp dir and launch dir like /tmp, and an
    inventory whose model matches only this test's token and port."""

    base: Path
    token: str
    port: int
    uid: int

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def launch(self) -> Path:
        return self.base / "launch"

    @property
    def config(self) -> Path:
        return self.base / "inventory.yaml"

    @property
    def model(self) -> str:
        return f"m{self.token}"

    @property
    def script(self) -> Path:
        return self.base / f"serve_{self.token}.py"

    def inventory(self) -> Inventory:
        return parse_inventory(self.config.read_text())

    def look_alike(self) -> subprocess.Popen[bytes]:
        """A process in the model's scope: its pattern and its port."""
        process = subprocess.Popen([PYTHON, str(self.script), "--port", str(self.port)])
        deadline = time.monotonic() + 10
        while self.script.name.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the look-alike did not start"
            time.sleep(0.01)
        return process


@pytest.fixture
def scope() -> Iterator[Scope]:
    require_root()
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux: uids switched with setresuid")
    token = uuid.uuid4().hex[:10]
    base = Path(tempfile.mkdtemp(prefix=f"mlx-medic-not-ours-{token}-", dir="/var/tmp"))
    base.chmod(0o755)
    found = Scope(base, token, free_port(), 20000 + int(token[:4], 16) % 10000)
    found.state.mkdir()
    os.chown(found.state, found.uid, found.uid)
    for sticky in (found.tmp, found.launch):
        sticky.mkdir()
        sticky.chmod(0o1777)  # as /tmp: anyone may add, only an owner may remove
    found.script.write_text("import time\ntime.sleep(120)\n")
    found.config.write_text(f"""\
state_dir: {found.state}
nodes:
  n1: {{ssh: 127.0.0.2}}
models:
  {found.model}:
    model: /models/{token}
    nodes: [n1]
    port: {found.port}
    service: {{manager: supervisord, label: {found.model}}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
    tmp_dirs: [{found.tmp}]
    process_patterns: {{rank: ['serve_{token}\\.py( .*)?']}}
    policy: {{stale_tmp_age: 10m, kill_grace: 2s}}
launch_temp_dirs: [{found.launch}]
""")
    try:
        yield found
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_user(uid: int, work: Callable[[], Any]) -> Any:
    """`work()` in a forked child running as `uid` (no groups); its JSON-able result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            result = {"value": work()}
        except BaseException:
            result = {"error": traceback.format_exc()}
        try:
            with os.fdopen(write, "w") as out:
                json.dump(result, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as source:
        text = source.read()
    os.waitpid(pid, 0)
    result = json.loads(text)
    assert "error" not in result, result["error"]
    return result["value"]


def helper_as(scope: Scope, *argv: str) -> tuple[int, dict[str, Any], str]:
    """`mlx-medic node ARGV --json` as the scope's uid (setpriv): exit status, document, stderr."""
    user = [
        require_tool("setpriv"),
        f"--reuid={scope.uid}",
        f"--regid={scope.uid}",
        "--clear-groups",
        sys.executable,
        "-I",
    ]
    if subprocess.run([*user, "-c", "import mlx_medic"], capture_output=True).returncode:
        pytest.skip(f"this venv's {sys.executable} cannot run as another user here")
    result = subprocess.run(
        [
            *user,
            "-m",
            "mlx_medic.cli",
            "node",
            *argv,
            "--inventory",
            str(scope.config),
            "--node",
            "n1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=scope.base,
    )
    assert result.stdout.startswith("{"), result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def stale_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    (path / "part").write_bytes(b"x" * 5000)
    path.chmod(mode)
    return aged(path)


def dead_pid() -> int:
    process = subprocess.Popen([PYTHON, "-c", "pass"])
    process.wait()
    return process.pid


def step_context(helpers: FakeHelpers) -> RunContext:
    inventory = helpers.inventory
    return RunContext(
        model=inventory.model(MODEL),
        inventory=inventory,
        transport=LocalTransport(),
        run_id=7,
        health=Health(),
        log=logging.getLogger("test"),
        helpers=helpers,
    )


# --- the sweep --------------------------------------------------------------------------


def test_the_sweep_as_the_node_user_ends_its_own_look_alike_and_leaves_roots_as_not_ours(
    scope: Scope,
):
    theirs = scope.look_alike()  # root's: the node user may not signal it
    try:

        def sweep() -> dict[str, Any]:
            ours = scope.look_alike()
            inventory = scope.inventory()
            table = system_process_table(classifier(PatternSet.of(inventory)))
            report = NodeSweep(
                inventory=inventory,
                model=inventory.model(scope.model),
                node="n1",
                state_dir=scope.state,
                table=table,
            ).run()
            ours.wait(10)
            return {"ours": ours.pid, "document": report.to_json()}

        result = as_user(scope.uid, sweep)
        document = result["document"]
        assert [s["pid"] for s in document["signalled"]] == [result["ours"]]
        assert document["exited"] == [result["ours"]]
        (entry,) = document["not_ours"]
        assert (entry["pid"], entry["owner"], entry["uid"]) == (theirs.pid, "root", 0)
        assert entry["cmdline"][-3:] == [str(scope.script), "--port", str(scope.port)]
        assert "may not signal" in entry["why"]
        assert document["survivors"] == [] and document["complete"] and document["settled"]
        assert theirs.poll() is None  # never signalled
    finally:
        theirs.kill()
        theirs.wait()


async def test_the_sweep_helper_as_the_node_user_answers_and_the_step_ends_ok_naming_it(
    scope: Scope,
):
    theirs = scope.look_alike()
    try:
        status, document, stderr = helper_as(scope, "sweep", scope.model)
    finally:
        theirs.kill()
        theirs.wait()
    assert status == 0, stderr
    assert [e["pid"] for e in document["not_ours"]] == [theirs.pid]
    assert f"not ours: pid {theirs.pid} (rank) is root's: may not signal it" in stderr
    # The remediator's sweep step reads that very reply: ok, and its detail says so.
    helpers = FakeHelpers(make_inventory(), {("ai002", "sweep"): Answer(document, status, stderr)})
    result = await SweepStep(model=helpers.inventory.model(MODEL)).run(step_context(helpers))
    assert result.outcome is StepOutcome.OK and not result.unrecoverable
    assert (
        f"ai002: 0 signalled, 0 spared, 0 PD spent, 1 not ours (pid {theirs.pid} rank,"
        " root's: may not signal, left alone)"
    ) in result.detail


# --- the clean --------------------------------------------------------------------------


def roots_entries(scope: Scope) -> dict[str, Path]:
    """What root left in the sticky dirs, all stale: a dir the node user may not read, a
    file and a readable dir it may not remove, a dead launch's pid file it may not unlink."""
    unreadable = stale_dir(scope.tmp / f"tmp{scope.token}closed", mode=0o700)
    readable = stale_dir(scope.tmp / f"tmp{scope.token}open")
    file = scope.tmp / f"tmp{scope.token}file"
    file.write_text("root's")
    aged(file)
    leftover = scope.launch / f"tmp.Root{scope.token}"
    leftover.write_text(f"{dead_pid()}\n")
    aged(leftover)
    return {"closed": unreadable, "open": readable, "file": file, "leftover": leftover}


def own_entries(scope: Scope) -> dict[str, str]:
    """The node user's own stale entries (made in the child, as that user)."""
    mine = stale_dir(scope.tmp / f"tmp{scope.token}mine")
    leftover = scope.launch / f"tmp.Mine{scope.token}"
    leftover.write_text(f"{dead_pid()}\n")
    aged(leftover)
    return {"mine": str(mine), "leftover": str(leftover)}


def cleaner(scope: Scope, weigher: Weigher) -> Cleaner:
    inventory = scope.inventory()
    return Cleaner(
        model=inventory.model(scope.model),
        node="n1",
        dirs=scope_dirs(inventory.models_on("n1")),
        launch_dirs=[scope.launch],
        clock=time.time,
        weigher=weigher,
    )


@pytest.mark.parametrize("weigher", [PythonWeigher, default_weigher], ids=["walk", "default"])
def test_the_clean_as_the_node_user_removes_its_own_and_leaves_roots_whole_as_not_ours(
    scope: Scope,
    weigher: Callable[[], Weigher],
):
    theirs = roots_entries(scope)

    def clean() -> dict[str, Any]:
        own = own_entries(scope)
        report = cleaner(scope, weigher()).run()
        return {"own": own, "document": report.to_json(), "failed": report.failed}

    result = as_user(scope.uid, clean)
    document = result["document"]
    assert sorted(r["path"] for r in document["removed"]) == sorted(result["own"].values())
    assert result["failed"] == 0
    assert {e["path"]: (e["owner"], e["uid"]) for e in document["not_ours"]} == {
        str(path): ("root", 0) for path in theirs.values()
    }
    kinds = {Path(e["path"]).name: e["kind"] for e in document["not_ours"]}
    assert kinds[f"tmp.Root{scope.token}"] == "launch_leftover"
    assert kinds[f"tmp{scope.token}file"] == "stale_file"
    assert all(path.exists() for path in theirs.values())
    assert (theirs["open"] / "part").exists() and (theirs["closed"] / "part").exists()
    assert not any(Path(path).exists() for path in result["own"].values())


def test_another_users_part_met_while_removing_its_own_entry_is_not_ours_not_a_failure(
    scope: Scope,
):
    mixed = scope.tmp / f"tmp{scope.token}mixed"  # the node user's dir, root's dir inside
    mixed.mkdir()
    os.chown(mixed, scope.uid, scope.uid)
    stale_dir(mixed / "sub")
    aged(mixed)

    def clean() -> dict[str, Any]:
        report = cleaner(scope, PythonWeigher()).run()
        return {"document": report.to_json(), "failed": report.failed}

    result = as_user(scope.uid, clean)
    (entry,) = result["document"]["not_ours"]
    assert (entry["path"], entry["owner"], entry["kind"]) == (str(mixed), "root", "stale_dir")
    assert f"({mixed.name}/sub/part)" in entry["why"]
    assert result["failed"] == 0 and result["document"]["removed"] == []
    assert (mixed / "sub" / "part").exists()


async def test_the_clean_helper_as_the_node_user_exits_0_and_the_step_names_what_it_left(
    scope: Scope,
):
    theirs = roots_entries(scope)
    status, document, stderr = helper_as(scope, "clean", scope.model)
    assert status == 0, stderr
    assert {e["path"] for e in document["not_ours"]} == {str(p) for p in theirs.values()}
    assert f"not ours: stale_file {theirs['file']} is root's" in stderr
    helpers = FakeHelpers(make_inventory(), {("ai003", "clean"): Answer(document, status, stderr)})
    result = await CleanTmp(model=helpers.inventory.model(MODEL)).run(step_context(helpers))
    assert result.outcome is StepOutcome.OK
    said = result.detail.split("ai003: ")[1].split("; ai004")[0]
    assert said.startswith("0 removed, 0 bytes freed, 4 not ours (")
    assert said.endswith("root's: may not remove, left whole)")
    assert all(f"{path}, root's" in said for path in theirs.values())
