"""The `processes` collector: series always present, orphans by rule, a fake
/proc that misbehaves, and `promtool check metrics` on a live scrape."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mlx_medic.exporter.collector import ExporterContext, sample_value
from mlx_medic.exporter.collectors.processes import ProcessesCollector, make
from mlx_medic.platform.proc_linux import LinuxProcessTable
from mlx_medic.processes.info import ProcessInfo, Role, State
from mlx_medic.state.runs import record_current_run
from tests.exporter.process_tables import (
    INVENTORY,
    SSHD_LISTENER,
    SSHD_SESSION,
    FakeProc,
    launcher_argv,
    proc,
    rank_argv,
    ssh_client_argv,
    table,
)
from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[2]


class StaticTable:
    def __init__(self, processes: list[ProcessInfo]):
        self.processes = processes

    def snapshot(self) -> list[ProcessInfo]:
        return list(self.processes)


def collect(
    processes,
    *,
    node="ai002",
    state_dir=Path("/nonexistent"),
    now=10_000.0,
    established=lambda sshd: True,
    inventory=INVENTORY,
    listening=None,
    files=None,
):
    ports = listening or {}
    collector = ProcessesCollector(
        node=node,
        inventory=inventory,
        state_dir=state_dir,
        table=StaticTable(processes),
        clock=lambda: now,
        established=established,
        listening=lambda: lambda pid, port: port in ports.get(pid, ()),
        read_file=lambda p, path: (files or {}).get(path),
    )
    return list(collector.collect())


def value(families, name, **labels):
    return sample_value(families, name, labels)


def series(families, name):
    """Every sample of the family, as (labels, value) pairs."""
    return [(s.labels, s.value) for f in families if f.name == name for s in f.samples]


def test_orphans_by_state_and_the_oldest_age_are_present_for_every_inventory_model_when_empty():
    """What the alerts read is always there, so "no orphans" is 0, never a missing series."""
    families = collect([])
    for model in ("glm", "qwq"):
        assert value(families, "mlx_orphan_oldest_age_seconds", model=model) == 0.0
        for state in State:
            assert value(families, "mlx_orphan_processes", model=model, state=state) == 0.0
    assert len(series(families, "mlx_orphan_processes")) == 2 * len(State)


def test_the_breakdowns_have_no_series_while_they_are_zero():
    """Processes by role and state, orphans and suspects by rule, remote suspects by peer:
    a scrape of a quiet node carries none of them."""
    families = collect([])
    for name in (
        "mlx_processes",
        "mlx_orphan_processes_by_rule",
        "mlx_suspected_orphan_processes",
        "mlx_suspected_remote_orphans",
    ):
        assert series(families, name) == []


def peer_with_two_ranks() -> list[ProcessInfo]:
    return table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(100, 1, SSHD_LISTENER),
        proc(200, 100, SSHD_SESSION, name="sshd"),
        proc(
            201, 200, rank_argv(), env={"MLX_RANK": "1"}, created=1000, state=State.UNINTERRUPTIBLE
        ),
        proc(300, 100, SSHD_SESSION, name="sshd"),
        proc(301, 300, rank_argv(), env={"MLX_RANK": "1"}, created=9000),
    )


def test_the_peer_reports_its_uninterruptible_orphan_by_rule_and_age():
    families = collect(
        peer_with_two_ranks(), now=62_200.0, established=lambda sshd: sshd.pid == 300
    )
    assert value(families, "mlx_processes", model="glm", role="rank", state="uninterruptible") == 1
    assert value(families, "mlx_processes", model="glm", role="rank", state="sleeping") == 1
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="uninterruptible",
            rule="ssh_client_lost",
        )
        == 1
    )
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="sleeping",
            rule="ssh_client_lost",
        )
        is None
    )
    assert value(families, "mlx_orphan_processes", model="glm", state="uninterruptible") == 1
    assert value(families, "mlx_orphan_processes", model="glm", state="sleeping") == 0
    assert value(families, "mlx_orphan_oldest_age_seconds", model="glm") == 61_200.0


def test_ranks_nothing_tells_apart_are_suspects_in_their_own_series_never_orphans():
    families = collect(peer_with_two_ranks(), now=62_200.0)
    for state in ("uninterruptible", "sleeping"):
        assert (
            value(
                families,
                "mlx_suspected_orphan_processes",
                model="glm",
                role="rank",
                state=state,
                rule="excess_ranks_undecided",
            )
            == 1
        )
    assert (
        sum(s.value for f in families if f.name == "mlx_orphan_processes" for s in f.samples) == 0
    )
    assert value(families, "mlx_orphan_oldest_age_seconds", model="glm") == 0


def test_without_inventory_two_ranks_of_one_placement_and_rank_are_found_on_the_peer():
    ring = '[["127.0.0.2:45000"], ["127.0.0.3:45001"]]\n'
    processes = [p for p in peer_with_two_ranks() if p.pid not in (201, 301)] + table(
        proc(
            201,
            200,
            rank_argv(model="/srv/tiny"),
            env={"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/tmp.a"},
            created=1000,
        ),
        proc(
            301,
            300,
            rank_argv(model="/srv/tiny"),
            env={"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/tmp.b"},
            created=9000,
        ),
    )
    files = {"/tmp/tmp.a": ring, "/tmp/tmp.b": ring}
    families = collect(processes, inventory=None, node=None, files=files)
    assert (
        value(
            families,
            "mlx_suspected_orphan_processes",
            model="/srv/tiny",
            role="rank",
            state="sleeping",
            rule="duplicate_rank_undecided",
        )
        == 2
    )
    families = collect(
        processes, inventory=None, node=None, files=files, established=lambda sshd: sshd.pid == 300
    )
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="/srv/tiny",
            role="rank",
            state="sleeping",
            rule="ssh_client_lost",
        )
        == 1
    )


def test_a_ranks_placement_is_read_when_it_is_first_seen_and_outlives_its_hostfile():
    """Stale tmp files are cleaned; mlx.launch's hostfile is one. A rank's placement is
    read once, when the rank is first seen, and kept for the life of the process."""
    ring = '[["127.0.0.2:45000"], ["127.0.0.3:45001"]]\n'
    files = {"/tmp/tmp.a": ring, "/tmp/tmp.b": ring}
    reads: list[str] = []

    def read(proc: ProcessInfo, path: str) -> str | None:
        reads.append(path)
        return files.get(path)

    launcher = proc(5, 1, launcher_argv(rank_argv(model="/srv/tiny")))
    first = proc(
        10,
        5,
        rank_argv(model="/srv/tiny"),
        env={"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/tmp.a"},
        created=1000,
    )
    source = StaticTable(table(proc(1, 0, ["/sbin/init"]), launcher, first))
    collector = ProcessesCollector(
        node=None,
        inventory=None,
        state_dir=Path("/nonexistent"),
        table=source,
        clock=lambda: 0.0,
        established=lambda sshd: True,
        listening=lambda: lambda pid, port: False,
        read_file=read,
    )
    list(collector.collect())
    del files["/tmp/tmp.a"]  # cleaned away while the rank runs
    second = proc(
        11,
        5,
        rank_argv(model="/srv/tiny"),
        env={"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/tmp.b"},
        created=2000,
    )
    source.processes.append(second)
    families = list(collector.collect())
    assert (
        value(
            families,
            "mlx_suspected_orphan_processes",
            model="/srv/tiny",
            role="rank",
            state="sleeping",
            rule="duplicate_rank_undecided",
        )
        == 2
    )
    assert reads == ["/tmp/tmp.a", "/tmp/tmp.b"]  # once each
    # pid 10 ends and is reused by another process: that one is read afresh
    source.processes[2] = proc(
        10,
        5,
        rank_argv(model="/srv/tiny"),
        env={"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/tmp.c"},
        created=3000,
    )
    list(collector.collect())
    assert reads[-1] == "/tmp/tmp.c"


def test_a_stale_run_id_is_read_from_the_state_dir(tmp_path: Path):
    record_current_run(tmp_path, "glm", "run-new")
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "1", "MLX_MEDIC_RUN_ID": "run-old"}),
        proc(11, 1, rank_argv(), env={"MLX_RANK": "1", "MLX_MEDIC_RUN_ID": "run-new"}),
    )
    families = collect(processes, state_dir=tmp_path, established=lambda sshd: None)
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="sleeping",
            rule="stale_run_id",
        )
        == 1
    )


def test_the_launching_node_reports_the_dead_launchs_leftovers_and_the_suspected_peer():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 1, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    families = collect(processes, node="ai001")
    for role in ("rank", "ssh_client"):
        assert (
            value(
                families,
                "mlx_orphan_processes_by_rule",
                model="glm",
                role=role,
                state="sleeping",
                rule="launcher_gone",
            )
            == 1
        )
    assert value(families, "mlx_suspected_remote_orphans", model="glm", peer="ai002") == 1


def test_the_head_node_suspects_no_peer_while_all_is_well():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(10, 5, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 5, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    families = collect(processes, node="ai001")
    assert series(families, "mlx_suspected_remote_orphans") == []
    assert value(families, "mlx_processes", model="glm", role="launcher", state="sleeping") == 1


def test_without_inventory_models_are_named_by_their_model_argument():
    processes = table(proc(1, 0, ["/sbin/init"]), proc(10, 1, rank_argv(model="/srv/tiny")))
    families = collect(processes, inventory=None)
    assert value(families, "mlx_processes", model="/srv/tiny", role="rank", state="sleeping") == 1
    assert value(families, "mlx_processes", model="/srv/tiny", role="share", state="zombie") is None
    assert value(families, "mlx_orphan_processes", model="/srv/tiny", state="zombie") == 0


def test_without_inventory_each_model_found_is_logged_once_with_how_it_was_found(caplog):
    processes = table(proc(1, 0, ["/sbin/init"]), proc(10, 1, rank_argv(model="/srv/tiny")))
    collector = ProcessesCollector(
        node="x",
        inventory=None,
        state_dir=Path("/nonexistent"),
        table=StaticTable(processes),
        clock=lambda: 0.0,
        established=lambda sshd: True,
    )
    with caplog.at_level("INFO", logger="mlx_medic.exporter.processes"):
        list(collector.collect())
        list(collector.collect())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["watching model /srv/tiny: found by the --model argument of rank pid 10"]


# --- a fake /proc that misbehaves ------------------------------------------------------


def fake_table(root: Path, clock: list[float] | None = None) -> LinuxProcessTable:
    now = clock if clock is not None else [0.0]
    return LinuxProcessTable(proc_root=root, monotonic=lambda: now[0])


def test_a_process_that_vanishes_mid_scan_never_fails_a_scrape(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, rank_argv(model="/srv/a"))
    (tmp_path / "proc" / "11").mkdir()  # listed, then gone before any file was read
    table_ = fake_table(fake.root)
    assert {p.pid for p in table_.snapshot()} == {1, 10}
    # A scoped process whose stat vanishes after it was classified.
    (fake.root / "10" / "stat").unlink()
    assert table_.snapshot() == []


def test_an_unreadable_proc_entry_never_fails_a_scrape(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, rank_argv(model="/srv/a"))
    bad = fake.add(12, 1, rank_argv(model="/srv/b"))
    (bad / "cmdline").unlink()
    (bad / "cmdline").mkdir()  # reading it fails with EISDIR, as EACCES would
    (fake.root / "10" / "environ").unlink()
    (fake.root / "10" / "environ").mkdir()
    table_ = fake_table(fake.root)
    processes = {p.pid: p for p in table_.snapshot()}
    assert processes[10].role is Role.RANK
    assert processes[10].env == {}
    assert 12 not in processes
    assert table_.read_errors >= 1
    collector = ProcessesCollector(
        node="x",
        inventory=None,
        state_dir=tmp_path,
        table=table_,
        clock=lambda: 0.0,
        established=lambda sshd: None,
    )
    assert list(collector.collect())


def test_a_command_line_with_odd_bytes_never_fails_a_scrape(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, b"/usr/bin/python3\0-m\0mlx_lm.server\0--model\0/srv/\xff\xfe\x00bad\0")
    collector = ProcessesCollector(
        node="x",
        inventory=None,
        state_dir=tmp_path,
        table=fake_table(fake.root),
        clock=lambda: 0.0,
        established=lambda sshd: None,
    )
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'mlx_processes{model="/srv/\ufffd\ufffd",role="rank",state="sleeping"} 1.0' in text


def test_an_exec_into_a_rank_is_seen_on_the_recheck(tmp_path: Path):
    """mlx.launch's script is `bash -c '...; exec python -m mlx_lm.server'`: same pid."""
    clock = [0.0]
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, ["/bin/bash", "-c", "export MLX_RANK=0; exec python3 ..."])
    table_ = fake_table(fake.root, clock)
    assert [p.pid for p in table_.snapshot() if p.role] == []
    (fake.root / "10" / "cmdline").write_bytes(b"\0".join(a.encode() for a in rank_argv()))
    clock[0] = 2.0
    assert [p.pid for p in table_.snapshot() if p.role] == [10]


def test_a_reused_pid_is_classified_afresh(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, ["sleep", "100"])
    table_ = fake_table(fake.root)
    assert [p.pid for p in table_.snapshot() if p.role] == []
    shutil.rmtree(fake.root / "10")
    os.mkdir(fake.root / "spacer")  # the new directory gets a new inode, as procfs does
    fake.add(10, 1, rank_argv(), starttime=500)
    assert [p.pid for p in table_.snapshot() if p.role] == [10]


def test_a_scrape_on_linux_never_walks_psutil(monkeypatch: pytest.MonkeyPatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux reads /proc itself")
    import psutil

    def refuse(*args, **kwargs):
        raise AssertionError("psutil.process_iter on the scrape path")

    monkeypatch.setattr(psutil, "process_iter", refuse)
    collector = make(ExporterContext(node="here"))
    assert isinstance(collector, ProcessesCollector)
    assert isinstance(collector.table, LinuxProcessTable)
    assert list(collector.collect())


# --- promtool on a live scrape ---------------------------------------------------------------


def test_promtool_accepts_a_live_scrape(tmp_path: Path):
    promtool = require_tool("promtool")
    model = f"/var/tmp/mlx-medic-promtool-{uuid.uuid4().hex[:8]}"
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "--model", model],
        env={**os.environ, "MLX_RANK": "0"},
    )
    try:
        scrape = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_medic.cli",
                "exporter",
                "--once",
                "--state-dir",
                str(tmp_path),
            ],
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=True,
        )
    finally:
        rank.kill()
        rank.wait()
    assert (
        f'mlx_processes{{model="{model}",role="rank",state="sleeping"}} 1.0'.encode()
        in scrape.stdout
    )
    check = subprocess.run(
        [promtool, "check", "metrics"], input=scrape.stdout, capture_output=True, timeout=60
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def ledger_reader(processes: list[ProcessInfo], state_dir: Path, boot: str):
    return ProcessesCollector(
        node="ai002",
        inventory=INVENTORY,
        state_dir=state_dir,
        table=StaticTable(processes),
        clock=lambda: 62_200.0,
        established=lambda sshd: sshd.pid == 300,
        listening=lambda: lambda pid, port: False,
        read_file=lambda p, path: None,
        boot_id=lambda: boot,
    )


def collect_with_ledger(processes: list[ProcessInfo], state_dir: Path, boot: str):
    return list(ledger_reader(processes, state_dir, boot).collect())


def test_an_orphan_the_ledger_records_as_a_survivor_of_sigkill_is_not_counted_as_an_orphan(
    tmp_path: Path,
):
    """No sweep can end it: it is mlx_unkillable_processes' (the ledger collector), so the
    orphan alert does not send the remediator's sweep-orphans after it again and again."""
    from mlx_medic.state.ledger import record_spend

    record_spend(
        tmp_path,
        "ai002",
        "unkillable",
        pid=201,
        start_time=1000.0,
        backend="jaccl",
        model="glm",
        boot_id="b1",
    )
    families = collect_with_ledger(peer_with_two_ranks(), tmp_path, "b1")
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="uninterruptible",
            rule="ssh_client_lost",
        )
        is None
    )
    assert value(families, "mlx_orphan_processes", model="glm", state="uninterruptible") == 0
    # every other series as before: the process is still there, and still the oldest orphan
    assert value(families, "mlx_processes", model="glm", role="rank", state="uninterruptible") == 1
    assert value(families, "mlx_orphan_oldest_age_seconds", model="glm") == 61_200.0
    # another boot's ledger is empty: the orphan is counted again
    families = collect_with_ledger(peer_with_two_ranks(), tmp_path, "b2")
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="uninterruptible",
            rule="ssh_client_lost",
        )
        == 1
    )


def test_a_reused_pid_of_a_recorded_survivor_is_an_orphan_like_any_other(tmp_path: Path):
    from mlx_medic.state.ledger import record_spend

    record_spend(
        tmp_path,
        "ai002",
        "unkillable",
        pid=201,
        start_time=999.0,
        backend="jaccl",
        model="glm",
        boot_id="b1",
    )  # another process, gone
    families = collect_with_ledger(peer_with_two_ranks(), tmp_path, "b1")
    assert (
        value(
            families,
            "mlx_orphan_processes_by_rule",
            model="glm",
            role="rank",
            state="uninterruptible",
            rule="ssh_client_lost",
        )
        == 1
    )


def test_an_unreadable_ledger_leaves_the_orphans_counted_and_the_scrape_working(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
):
    (tmp_path / "pd-ledger.json").write_text("{not json")
    collector = ledger_reader(peer_with_two_ranks(), tmp_path, "b1")
    for _ in range(2):
        families = list(collector.collect())
        assert (
            value(
                families,
                "mlx_orphan_processes_by_rule",
                model="glm",
                role="rank",
                state="uninterruptible",
                rule="ssh_client_lost",
            )
            == 1
        )
    warned = [r for r in caplog.records if "counted as orphans" in r.getMessage()]
    assert len(warned) == 1  # said once while it stays the same


def test_an_unrelated_process_keeps_no_argv_yet_its_exec_into_a_rank_is_seen(tmp_path: Path):
    """Memory on a busy node: only the hash of a non-candidate's command line is kept
    (bench/busy_node); a rank's ancestors still show their argv to the rules."""
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    sleeper = fake.add(20, 1, ["/usr/bin/sleep", "3600"])
    clock = [0.0]
    table_ = fake_table(fake.root, clock)
    assert table_.snapshot() == []
    assert table_._cache[20].cmdline == () and table_._cache[1].cmdline == ()
    clock[0] = 10.0**6  # past every re-check: the same argv stays the same entry
    kept = table_._cache[20]
    assert table_.snapshot() == [] and table_._cache[20] is kept
    (sleeper / "cmdline").write_bytes(b"\0".join(a.encode() for a in rank_argv()) + b"\0")
    clock[0] = 2 * 10.0**6
    processes = {p.pid: p for p in table_.snapshot()}
    assert processes[20].role is Role.RANK and processes[20].cmdline == tuple(rank_argv())
    assert processes[1].cmdline == ("/sbin/init",)  # the rank's ancestor
