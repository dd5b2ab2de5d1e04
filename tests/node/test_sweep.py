"""The sweep's scope rules and signalling, on synthetic process tables with the signal,
identity and clock seams replaced (the real thing, on testbed nodes:
tests/node/test_sweep_clean_testbed.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.node.sweep import (
    BROKEN_WINDOW,
    PROBE_WINDOW,
    PROBES,
    LedgerNotes,
    Mode,
    NodeSweep,
    Seams,
    in_sweep_scope,
)
from mlx_medic.platform.process_identity import Identity
from mlx_medic.processes.info import ProcessInfo, State
from mlx_medic.processes.not_ours import user_name
from mlx_medic.processes.orphan_scan import OrphanScan
from mlx_medic.processes.roles import PatternSet, classifier
from mlx_medic.processes.scope import ModelScoper
from mlx_medic.state.ledger import read_ledger
from mlx_medic.state.node_identity import write_node_id
from mlx_medic.state.runs import record_current_run
from tests.exporter.process_tables import (
    PYTHON,
    SSHD_LISTENER,
    launched_env,
    ssh_client_argv,
)
from tests.exporter.process_tables import proc as plain_proc
from tests.node.inventories import two_models

TMP = "/Users/ai/.cache/mlx-share/glm"
INVENTORY = parse_inventory(f"""
nodes:
  ai001: {{ssh: 192.168.101.1}}
  ai002: {{ssh: 192.168.101.2}}
models:
  glm:
    model: /models/glm
    nodes: [ai001, ai002]
    port: 8080
    service: {{manager: launchd, label: com.example.glm}}
    backends: {{ring: {{hostfile: /etc/mlx-medic/glm.ring.json}}}}
    tmp_dirs: [{TMP}]
    process_patterns: {{rank: ['serve\\.py( .*)?']}}
    policy: {{kill_grace: 2s}}
  qwq:
    model: /models/qwq
    nodes: [ai002]
    port: 8081
    service: {{manager: launchd, label: com.example.qwq}}
    backends: {{ring: {{hostfile: /etc/mlx-medic/qwq.ring.json}}}}
""")
GLM = INVENTORY.model("glm")
CLASSIFY = classifier(PatternSet.of(INVENTORY))


def proc(pid: int, ppid: int, argv: list[str] | str, **kwargs) -> ProcessInfo:
    """A process classified with the inventory's patterns, as the sweep's table does."""
    found = plain_proc(pid, ppid, argv, **kwargs)
    environment = dict(kwargs.get("env") or {})
    return replace(found, role=CLASSIFY(found.cmdline, lambda: environment))


def rank(pid: int, port: int = 8080, model: str = "/models/glm", ppid: int = 1, **kw):
    return proc(
        pid, ppid, [PYTHON, "-m", "mlx_lm.server", "--model", model, "--port", str(port)], **kw
    )


def scoped(process: ProcessInfo, run_ids: frozenset[str] = frozenset()) -> bool:
    return in_sweep_scope(process, GLM, ModelScoper(INVENTORY), set(run_ids))


# --- scope ------------------------------------------------------------------------------


def test_a_copy_or_a_tail_that_merely_names_the_models_dirs_is_never_in_scope():
    assert not scoped(proc(20, 1, ["cp", "-r", f"{TMP}/tmpab12", "/backup"]))
    assert not scoped(proc(21, 1, ["tail", "-f", f"{TMP}/serve.log"]))
    assert not scoped(proc(22, 1, ["grep", "mlx_lm.server", "--port", "8080"]))
    assert not scoped(proc(23, 1, [PYTHON, "-c", "import time; time.sleep(9)", "--port", "8080"]))


def test_mlx_medic_itself_is_never_in_scope_even_started_from_a_ranks_environment():
    env = {"MLX_RANK": "0", "MLX_MEDIC_MODEL": "glm"}
    assert not scoped(proc(30, 1, ["/usr/local/bin/mlx-medic", "serve", "glm"], env=env))
    assert not scoped(
        proc(
            31,
            1,
            [PYTHON, "-m", "mlx_medic.cli", "node", "sweep", "glm", "--port", "8080"],
            env=env,
        )
    )
    assert not scoped(proc(32, 1, [PYTHON, "-m", "mlx_medic", "serve", "glm"], env=env))


def test_a_rank_needs_the_models_pattern_and_one_of_its_keys():
    assert scoped(rank(40))  # port and model path
    assert scoped(proc(41, 1, [PYTHON, "/opt/seed/serve.py", "--tmpdir", f"{TMP}/x"]))
    assert scoped(
        proc(42, 1, [PYTHON, "/opt/x/worker.py"], env={"MLX_RANK": "1", "MLX_MEDIC_MODEL": "glm"})
    )
    assert scoped(
        proc(
            43, 1, [PYTHON, "/opt/x/worker.py"], env={"MLX_RANK": "1", "MLX_MEDIC_RUN_ID": "run-7"}
        ),
        {"run-7"},
    )
    # The model's pattern without any of its keys: a looser pattern's catch, not the model's.
    assert not scoped(
        proc(44, 1, [PYTHON, "/opt/seed/serve.py", "--model", "/m/other", "--port", "9999"])
    )
    # Another model's rank, and a rank of no model.
    assert not scoped(rank(45, port=8081, model="/models/qwq"))
    assert not scoped(proc(46, 1, [PYTHON, "/opt/x/worker.py"], env={"MLX_RANK": "0"}))


def test_an_ssh_client_of_mlx_launch_is_in_the_scope_of_the_rank_it_starts():
    argv = [PYTHON, "-m", "mlx_lm.server", "--model", "/models/glm", "--port", "8080"]
    assert scoped(proc(50, 1, ssh_client_argv("ai002", 1, argv)))


# --- signalling --------------------------------------------------------------------------


class Table:
    def __init__(self, *processes: ProcessInfo):
        self.processes = list(processes)

    def snapshot(self) -> list[ProcessInfo]:
        return list(self.processes)


class World:
    """Processes as the seams see them: who lives, what a signal does, and time."""

    def __init__(self, *processes: ProcessInfo, dies_on=("SIGTERM", "SIGKILL")):
        self.live = {p.pid: p for p in processes}
        self.dies_on = dies_on  # signals that end a process (others stay pending)
        self.frozen: set[int] = set()  # uninterruptible: nothing ends them
        self.sent: list[tuple[int, str]] = []
        self.theirs: dict[int, int] = {}  # pid -> uid: another user's, signals refused (EPERM)
        self.now = 0.0
        self.sleeps = 0
        self.listening: dict[int, set[int]] = {}

    def identity(self, pid: int) -> Identity | None:
        p = self.live.get(pid)
        if p is None:
            return None
        state = State.UNINTERRUPTIBLE if pid in self.frozen else p.state
        return Identity(pid, p.create_time, p.cmdline, state)

    def kill(self, pid: int, signum: int) -> None:
        name = signal.Signals(signum).name
        self.sent.append((pid, name))
        if pid not in self.live:
            raise ProcessLookupError(pid)
        if pid in self.theirs:
            raise PermissionError(1, "Operation not permitted")
        if name in self.dies_on and pid not in self.frozen:
            del self.live[pid]

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds

    def seams(self, **extra) -> Seams:
        defaults = {
            "health": lambda model, state_dir: (True, "answered"),
            "lineage": lambda: {99999},
            "read_file": lambda p, path: None,
            "warn": lambda text: None,
            "may_signal": lambda pid: pid not in self.theirs,
            "owner": lambda pid: self.theirs.get(pid, 0),
        }
        return Seams(
            identity=self.identity,
            kill=self.kill,
            sleep=self.sleep,
            clock=lambda: self.now,
            **{**defaults, **extra},
        )


def sweep(
    world: World,
    *processes: ProcessInfo,
    mode=Mode.SCOPE,
    run_id=None,
    model=GLM,
    state_dir: Path = Path("/nonexistent"),
    spend=None,
    dry_run=False,
    **seams,
):
    scan = OrphanScan(
        node="ai001",
        inventory=INVENTORY,
        state_dir=state_dir,
        established=lambda sshd: True,
        listening=lambda: lambda pid, port: port in world.listening.get(pid, ()),
        read_file=lambda p, path: None,
    )
    return NodeSweep(
        inventory=INVENTORY,
        model=model,
        node="ai001",
        state_dir=state_dir,
        table=Table(*processes),
        mode=mode,
        run_id=run_id,
        dry_run=dry_run,
        seams=world.seams(**seams),
        scan=scan,
        spend=spend or (lambda **kw: True),
    ).run()


def test_sigterm_ends_the_models_processes_and_leaves_everything_else():
    init = proc(1, 0, SSHD_LISTENER)
    ours, other = rank(10), rank(11, port=8081, model="/models/qwq")
    tail = proc(12, 1, ["tail", "-f", f"{TMP}/log"])
    world = World(init, ours, other, tail)
    report = sweep(world, init, ours, other, tail)
    assert world.sent == [(10, "SIGTERM")]
    assert report.exited == [10] and report.complete
    document = report.to_json()
    assert document["grace_waited"] == 0  # everything went on SIGTERM: no grace ran out
    assert document["signalled"][0]["signals"] == ["SIGTERM"]
    assert set(world.live) == {1, 11, 12}


def test_what_ignores_sigterm_gets_sigkill_after_the_grace_period():
    stubborn = rank(10)
    world = World(stubborn, dies_on=("SIGKILL",))
    report = sweep(world, stubborn)
    assert world.sent == [(10, "SIGTERM"), (10, "SIGKILL")]
    assert world.now >= GLM.policy.kill_grace  # waited the grace first
    assert report.exited == [10] and report.complete
    assert report.to_json()["grace_waited"] >= GLM.policy.kill_grace  # said, for the run log


def test_without_policy_sigkill_a_survivor_of_sigterm_is_reported_not_killed():
    stubborn = rank(10)
    world = World(stubborn, dies_on=())
    model = GLM.model_copy(update={"policy": GLM.policy.model_copy(update={"sigkill": False})})
    report = sweep(world, stubborn, model=model)
    assert world.sent == [(10, "SIGTERM")]
    assert [s.proc.pid for s in report.survivors] == [10] and not report.complete
    assert report.to_json()["unkillable"] == []


def test_a_pid_reused_between_listing_and_signalling_is_never_hit():
    listed = rank(10, created=1000.0)
    world = World(listed)

    def reuse(process: ProcessInfo, signal_name: str) -> None:
        # The listed process ends; its pid goes to a new process with the same argv.
        world.live[10] = replace(listed, create_time=2000.0)

    report = sweep(world, listed, before_signal=reuse)
    assert world.sent == []
    assert report.exited == [] and report.complete
    (spared,) = report.spared
    assert spared["pid"] == 10 and "reused" in spared["reason"]


def test_an_uninterruptible_survivor_is_unkillable_and_not_retried_forever():
    frozen = rank(10)
    world = World(frozen)
    world.frozen.add(10)
    report = sweep(world, frozen)
    assert world.sent == [(10, "SIGTERM"), (10, "SIGKILL")]  # each once
    assert world.sleeps < 1000  # bounded waits
    document = report.to_json()
    assert [u["pid"] for u in document["unkillable"]] == [10]
    assert document["unkillable"][0]["state"] == "uninterruptible"
    assert document["complete"] is False


def test_a_sigkilled_jaccl_rank_is_one_ledger_spend_with_its_device(tmp_path: Path):
    env = {
        "MLX_RANK": "1",
        "MLX_IBV_DEVICES": "/tmp/tmp.devices",
        "MLX_JACCL_COORDINATOR": "192.168.101.1:5000",
    }
    jaccl, ring = rank(10, env=env), rank(11, env={"MLX_RANK": "0"})
    world = World(jaccl, ring, dies_on=("SIGKILL",))
    matrix = '[[null, "rdma_en5"], ["rdma_en5", null]]'
    files = {"/tmp/tmp.devices": matrix}
    report = sweep(
        world,
        jaccl,
        ring,
        state_dir=tmp_path,
        spend=LedgerNotes(tmp_path, "ai001"),
        read_file=lambda p, path: files.get(path),
    )
    assert report.pd_spent == 1
    ledger = read_ledger(tmp_path, "ai001")
    assert [(e.kind, e.pid, e.devices, e.model) for e in ledger.entries] == [
        ("ended", 10, ("rdma_en5",), "glm"),  # noted before SIGTERM: a signal of ours ends it
        ("sigkill", 10, ("rdma_en5",), "glm"),
    ]
    assert ledger.debt == 1


def test_a_listener_on_the_models_port_that_answers_is_never_touched_by_any_sweep():
    server = rank(10)
    for mode in (Mode.SCOPE, Mode.ORPHANS_ONLY, Mode.START_SWEEP):
        world = World(server)
        world.listening[10] = {8080}
        warnings: list[str] = []
        report = sweep(world, server, mode=mode, warn=warnings.append)
        assert world.sent == []
        (spared,) = report.spared
        assert (
            "not an orphan" if mode is Mode.ORPHANS_ONLY else "answers the health probe"
        ) in spared["reason"]
        document = report.to_json()
        if mode is Mode.START_SWEEP:  # another instance serves: the wrapper must not start
            assert document["serving_listener"]["pid"] == 10
            assert "another instance serves the model" in warnings[0]
        else:
            assert document["serving_listener"] is None


def test_a_listener_is_hung_only_after_several_failed_probes_over_a_window():
    hung = rank(10)
    for mode in (Mode.SCOPE, Mode.START_SWEEP):
        world = World(hung)
        world.listening[10] = {8080}
        asked: list[float] = []

        def never(model, state_dir, world=world, asked=asked):
            asked.append(world.now)
            return False, "timed out"

        report = sweep(world, hung, mode=mode, health=never)
        assert world.sent == [(10, "SIGTERM")]  # the hung rank 0 holding the port
        assert report.to_json()["listeners_signalled"] == [10]
        assert len(asked) == PROBES and asked[-1] - asked[0] == pytest.approx(PROBE_WINDOW)

    # Refused at once each time (an error, a closed connection): broken, not busy.
    world = World(hung)
    world.listening[10] = {8080}
    asked = []
    report = sweep(
        world,
        hung,
        health=lambda model, state_dir: (
            asked.append(world.now),
            (False, "RemoteDisconnected", False),
        )[1],
    )
    assert world.sent == [(10, "SIGTERM")]
    assert len(asked) == PROBES and asked[-1] - asked[0] == pytest.approx(BROKEN_WINDOW)

    # Slow to answer once, then answering: a loaded server, spared.
    world = World(hung)
    world.listening[10] = {8080}
    answers = iter([(False, "timed out"), (True, "answered")])
    report = sweep(world, hung, health=lambda model, state_dir: next(answers))
    assert world.sent == [] and "answers the health probe" in report.spared[0]["reason"]

    world = World(hung)
    world.listening[10] = {8080}
    report = sweep(
        world, hung, mode=Mode.ORPHANS_ONLY, health=lambda model, state_dir: (False, "timed out")
    )
    assert world.sent == []  # the serving rank is never an orphan


class Notes(LedgerNotes):
    """The ledger notes a sweep writes, kept in order."""

    def __init__(self) -> None:
        self.written: list[tuple[str, dict]] = []
        self.known: set[tuple[int, float]] = set()  # survivors an earlier sweep recorded

    def spend(self, **fields) -> bool:
        self.written.append((fields.pop("kind"), fields))
        return True

    def ended(self, processes) -> None:
        self.written.append(("ended", {"processes": list(processes)}))

    def count_gone(self) -> None:
        self.written.append(("count_gone", {}))

    def survivors(self) -> set[tuple[int, float]]:
        return self.known


JACCL_ENV = {
    "MLX_RANK": "1",
    "MLX_IBV_DEVICES": "/tmp/tmp.devices",
    "MLX_JACCL_COORDINATOR": "10.0.0.1:5000",
}
DEVICES = {"/tmp/tmp.devices": '[[null, "rdma_en5"], ["rdma_en5", null]]'}


def test_a_process_this_user_may_not_signal_is_not_ours_never_signalled_nor_a_survivor():
    """The helper runs as the node's login user: another user's look-alike is named with
    its owner and left alone, the model's own processes are ended, and the sweep is complete."""
    ours, theirs = rank(10), rank(11)
    world = World(ours, theirs)
    world.theirs[11] = 4243
    report = sweep(world, ours, theirs)
    assert world.sent == [(10, "SIGTERM")]  # never even tried: signal 0 said no
    assert report.exited == [10] and report.complete and report.settled
    (entry,) = report.to_json()["not_ours"]
    assert (entry["pid"], entry["uid"], entry["role"]) == (11, 4243, "rank")
    assert entry["owner"] == user_name(4243)  # its name, or the uid where there is none
    assert "may not signal" in entry["why"] and 11 in world.live


def test_a_signal_refused_after_the_check_is_not_ours_too():
    """Its owner changed between the check and the signal (a setuid exec): still an answer."""
    target = rank(10)
    world = World(target)
    report = sweep(
        world,
        target,
        may_signal=lambda pid: True,
        before_signal=lambda proc, name: world.theirs.setdefault(10, 0),
    )
    assert world.sent == [(10, "SIGTERM")]
    assert report.complete and report.exited == [] and report.spared == []
    (entry,) = report.to_json()["not_ours"]
    assert entry["pid"] == 10 and entry["owner"] == "root" and "SIGTERM refused" in entry["why"]


def test_another_users_hung_listener_on_the_port_is_not_ours_and_not_counted_as_ended():
    hung = rank(10)
    world = World(hung)
    world.listening[10] = {8080}
    world.theirs[10] = 0
    report = sweep(
        world, hung, mode=Mode.START_SWEEP, health=lambda model, state_dir: (False, "timed out")
    )
    document = report.to_json()
    assert world.sent == [] and document["listeners_signalled"] == []
    (entry,) = document["not_ours"]
    assert entry["pid"] == 10 and entry["holds_port"] is True and report.complete


def test_a_survivor_of_sigkill_is_recorded_once_with_its_devices_and_the_sweep_is_settled():
    frozen = rank(10, env=JACCL_ENV)
    world = World(frozen)
    world.frozen.add(10)
    notes = Notes()
    report = sweep(world, frozen, spend=notes, read_file=lambda p, path: DEVICES.get(path))
    assert [kind for kind, _ in notes.written] == ["count_gone", "ended", "sigkill", "unkillable"]
    unkillable = notes.written[3][1]
    assert (
        unkillable["pid"],
        unkillable["devices"],
        unkillable["backend"],
        unkillable["holds_port"],
    ) == (10, ("rdma_en5",), "jaccl", False)
    document = report.to_json()
    (entry,) = document["unkillable"]
    assert (entry["domains"], entry["devices"], entry["model"]) == (1, ["rdma_en5"], "glm")
    assert document["complete"] is False and document["settled"] is True


def test_a_survivor_the_ledger_already_knows_is_signalled_again_but_not_waited_for():
    frozen = rank(10, env=JACCL_ENV)
    world = World(frozen)
    world.frozen.add(10)
    notes = Notes()
    notes.known = {(10, frozen.create_time)}  # an earlier sweep recorded it unkillable
    report = sweep(world, frozen, spend=notes, read_file=lambda p, path: DEVICES.get(path))
    assert world.sent == [(10, "SIGTERM"), (10, "SIGKILL")]  # in case it thawed
    assert world.now == 0.0  # no grace, no wait after SIGKILL
    assert [u["pid"] for u in report.to_json()["unkillable"]] == [10] and report.settled


def test_a_survivor_on_the_models_port_leaves_the_sweep_unsettled():
    hung = rank(10)
    world = World(hung)
    world.frozen.add(10)
    world.listening[10] = {8080}
    report = sweep(
        world, hung, mode=Mode.START_SWEEP, health=lambda model, state_dir: (False, "timed out")
    )
    (entry,) = report.to_json()["unkillable"]
    assert entry["holds_port"] is True and entry["backend"] == "unknown"
    assert report.settled is False


def test_a_killable_survivor_leaves_the_sweep_unsettled():
    stubborn = rank(10)
    world = World(stubborn, dies_on=())  # ignores every signal but is not in D
    report = sweep(world, stubborn)
    assert report.to_json()["unkillable"] == [] and report.settled is False


def test_the_callers_grace_shortens_the_wait_before_sigkill_but_never_lengthens_it():
    for grace, waited in ((0.5, 0.5), (60.0, 2.0)):  # GLM's policy.kill_grace is 2s
        stubborn = rank(10)
        world = World(stubborn, dies_on=("SIGKILL",))  # an orphan that ignores SIGTERM
        scan = OrphanScan(
            node="ai001",
            inventory=INVENTORY,
            state_dir=Path("/nonexistent"),
            established=lambda sshd: True,
            listening=lambda: lambda pid, port: False,
            read_file=lambda p, path: None,
        )
        NodeSweep(
            inventory=INVENTORY,
            model=GLM,
            node="ai001",
            state_dir=Path("/nonexistent"),
            table=Table(stubborn),
            seams=world.seams(),
            scan=scan,
            spend=Notes(),
            grace=grace,
        ).run()
        assert world.sent == [(10, "SIGTERM"), (10, "SIGKILL")]
        assert world.now == pytest.approx(waited, abs=0.05)


def test_jaccl_ranks_are_noted_as_ended_by_us_before_sigterm_reaches_them():
    jaccl, ring = rank(10, env=JACCL_ENV), rank(11, env={"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/h"})
    world = World(jaccl, ring)
    order: list[str] = []
    notes = Notes()
    original = world.kill

    def kill(pid: int, signum: int) -> None:
        order.append(f"{signal.Signals(signum).name} {pid}")
        original(pid, signum)

    world.kill = kill  # type: ignore[method-assign]
    notes.ended = lambda processes: order.append(f"ended {[p[0] for p in processes]}")  # type: ignore[method-assign]
    sweep(world, jaccl, ring, spend=notes, read_file=lambda p, path: DEVICES.get(path))
    assert order == ["ended [10]", "SIGTERM 10", "SIGTERM 11"]


def test_the_wrapper_ending_its_own_run_may_end_its_listener_but_no_other_run():
    ours = rank(10, env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-2"})
    theirs = rank(11, env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-1"})
    world = World(ours, theirs)
    world.listening[10] = {8080}
    sweep(world, ours, theirs, mode=Mode.RUN, run_id="run-2")
    assert world.sent == [(10, "SIGTERM")]

    world = World(ours, theirs)
    world.listening[11] = {8080}
    sweep(world, ours, theirs, mode=Mode.RUN, run_id="run-1")
    assert world.sent == [(11, "SIGTERM")]


def test_a_listener_on_another_models_port_is_never_touched_even_by_the_start_sweep():
    squatter = rank(10, env={"MLX_RANK": "0", "MLX_MEDIC_MODEL": "glm"})
    for mode in Mode:
        world = World(squatter)
        world.listening[10] = {8081}
        report = sweep(world, squatter, mode=mode, run_id="r" if mode is Mode.RUN else None)
        assert world.sent == []
        if mode is not Mode.RUN:
            assert "qwq" in report.spared[0]["reason"]


def test_orphans_only_ends_orphans_and_spares_suspects_and_the_current_run(tmp_path: Path):
    record_current_run(tmp_path, "glm", "run-2")
    current = rank(10, env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-2"})
    stale = rank(11, env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-1"})
    world = World(current, stale)
    report = sweep(world, current, stale, mode=Mode.ORPHANS_ONLY, state_dir=tmp_path)
    assert world.sent == [(11, "SIGTERM")]
    assert report.to_json()["signalled"][0]["rule"] == "stale_run_id"
    assert {s["pid"] for s in report.spared} == {10}

    # Two rank-1s of one placement, each held by a connected session: suspects.
    ring = '[["10.0.0.1:1"], ["10.0.0.2:2"]]'
    sessions = [proc(p, 1, ["sshd: ai@ttys000"]) for p in (20, 21)]
    twins = [rank(30 + i, ppid=20 + i, env=launched_env(1, f"/tmp/tmp.h{i}")) for i in (0, 1)]
    scan_files = {"/tmp/tmp.h0": ring, "/tmp/tmp.h1": ring}
    world = World(*sessions, *twins)
    scan = OrphanScan(
        node="ai002",
        inventory=INVENTORY,
        state_dir=tmp_path,
        established=lambda sshd: True,
        listening=lambda: lambda pid, port: False,
        read_file=lambda p, path: scan_files.get(path),
    )
    report = NodeSweep(
        inventory=INVENTORY,
        model=GLM,
        node="ai002",
        state_dir=tmp_path,
        table=Table(*sessions, *twins),
        mode=Mode.ORPHANS_ONLY,
        seams=world.seams(),
        scan=scan,
    ).run()
    assert world.sent == []
    assert all("suspect" in s["reason"] for s in report.spared)


def test_the_current_run_is_read_once_per_sweep_even_when_none_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import mlx_medic.state.runs

    reads: list[str] = []
    read = mlx_medic.state.runs.read_current_run

    def counted(state_dir: Path, model: str) -> str | None:
        reads.append(model)
        return read(state_dir, model)

    monkeypatch.setattr(mlx_medic.state.runs, "read_current_run", counted)
    monkeypatch.setattr("mlx_medic.processes.orphan_scan.read_current_run", counted)
    stale = rank(11, env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-1"})
    sweep(World(stale), stale, mode=Mode.ORPHANS_ONLY, state_dir=tmp_path)
    assert reads == ["glm"]


def test_the_sweep_itself_and_its_ancestors_are_spared():
    parent = rank(10)
    world = World(parent)
    report = sweep(world, parent, lineage=lambda: {10})
    assert world.sent == [] and report.spared[0]["pid"] == 10


def test_a_dry_run_signals_nothing_and_lists_the_targets():
    target = rank(10)
    world = World(target)
    document = sweep(world, target, dry_run=True).to_json()
    assert world.sent == []
    assert document["dry_run"] is True and [s["pid"] for s in document["signalled"]] == [10]


# --- the command line ---------------------------------------------------------------------


def node(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "node", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(two_models(str(tmp_path / "state")))
    write_node_id(tmp_path / "state", "n1")
    return path


def test_sweep_refuses_a_model_not_in_the_inventory_or_not_placed_here(config: Path):
    unknown = node("sweep", "nope", "--json", "--inventory", str(config))
    assert unknown.returncode == 2 and "'nope'" in unknown.stderr
    elsewhere = node("sweep", "m2", "--json", "--inventory", str(config))
    assert elsewhere.returncode == 2 and "'m2'" in elsewhere.stderr and "n1" in elsewhere.stderr
    bad_run = node("sweep", "m1", "--run", "a;b", "--inventory", str(config))
    assert bad_run.returncode == 2 and "run id" in bad_run.stderr
    both = node("sweep", "m1", "--orphans-only", "--start-sweep", "--inventory", str(config))
    assert both.returncode == 2


def test_sweep_prints_the_json_contract(config: Path):
    result = node("sweep", "m1", "--json", "--dry-run", "--inventory", str(config))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert {
        "schema",
        "command",
        "model",
        "node",
        "mode",
        "run_id",
        "dry_run",
        "signalled",
        "exited",
        "survivors",
        "unkillable",
        "spared",
        "pd_spent",
        "complete",
        "not_ours",
    } <= set(document)
    assert (document["schema"], document["command"], document["mode"]) == (1, "sweep", "scope")
    assert (document["model"], document["node"], document["complete"]) == ("m1", "n1", True)
