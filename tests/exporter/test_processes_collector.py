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
from mlx_medic.process_model import ProcessInfo, Role, State
from mlx_medic.runs import record_current_run
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


def collect(processes, *, node="ai002", state_dir=Path("/nonexistent"), now=10_000.0,
            established=lambda sshd: True, inventory=INVENTORY):
    collector = ProcessesCollector(
        node=node, inventory=inventory, state_dir=state_dir, table=StaticTable(processes),
        clock=lambda: now, established=established,
    )
    return list(collector.collect())


def value(families, name, **labels):
    return sample_value(families, name, labels)


def test_every_state_role_and_rule_is_present_for_every_inventory_model_even_when_empty():
    families = collect([])
    for model in ("glm", "qwq"):
        assert value(families, "mlx_orphan_oldest_age_seconds", model=model) == 0.0
        for role in Role:
            for state in State:
                assert value(families, "mlx_processes", model=model, role=role,
                             state=state) == 0.0
                for rule in ("stale_run_id", "excess_ranks", "launcher_gone",
                             "ssh_client_lost"):
                    assert value(families, "mlx_orphan_processes", model=model, role=role,
                                 state=state, rule=rule) == 0.0


def test_the_peer_reports_its_uninterruptible_orphan_by_rule_and_age():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(100, 1, SSHD_LISTENER),
        proc(200, 100, SSHD_SESSION, name="sshd"),
        proc(201, 200, rank_argv(), env={"MLX_RANK": "1"}, created=1000,
             state=State.UNINTERRUPTIBLE),
        proc(300, 100, SSHD_SESSION, name="sshd"),
        proc(301, 300, rank_argv(), env={"MLX_RANK": "1"}, created=9000),
    )
    families = collect(processes, now=62_200.0)
    assert value(families, "mlx_processes", model="glm", role="rank",
                 state="uninterruptible") == 1
    assert value(families, "mlx_processes", model="glm", role="rank", state="sleeping") == 1
    assert value(families, "mlx_orphan_processes", model="glm", role="rank",
                 state="uninterruptible", rule="excess_ranks") == 1
    assert value(families, "mlx_orphan_processes", model="glm", role="rank",
                 state="sleeping", rule="excess_ranks") == 0
    assert value(families, "mlx_orphan_oldest_age_seconds", model="glm") == 61_200.0


def test_a_stale_run_id_is_read_from_the_state_dir(tmp_path: Path):
    record_current_run(tmp_path, "glm", "run-new")
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "1", "MLX_MEDIC_RUN_ID": "run-old"}),
        proc(11, 1, rank_argv(), env={"MLX_RANK": "1", "MLX_MEDIC_RUN_ID": "run-new"}),
    )
    families = collect(processes, state_dir=tmp_path, established=lambda sshd: None)
    assert value(families, "mlx_orphan_processes", model="glm", role="rank",
                 state="sleeping", rule="stale_run_id") == 1


def test_the_launching_node_reports_the_dead_launchs_leftovers_and_the_suspected_peer():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 1, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    families = collect(processes, node="ai001")
    for role in ("rank", "ssh_client"):
        assert value(families, "mlx_orphan_processes", model="glm", role=role,
                     state="sleeping", rule="launcher_gone") == 1
    assert value(families, "mlx_suspected_remote_orphans", model="glm", peer="ai002") == 1


def test_the_head_node_publishes_a_zero_for_every_peer_while_all_is_well():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(10, 5, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 5, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    families = collect(processes, node="ai001")
    assert value(families, "mlx_suspected_remote_orphans", model="glm", peer="ai002") == 0
    assert value(families, "mlx_processes", model="glm", role="launcher", state="sleeping") == 1


def test_without_inventory_models_are_named_by_their_model_argument():
    processes = table(proc(1, 0, ["/sbin/init"]), proc(10, 1, rank_argv(model="/srv/tiny")))
    families = collect(processes, inventory=None)
    assert value(families, "mlx_processes", model="/srv/tiny", role="rank", state="sleeping") == 1
    assert value(families, "mlx_processes", model="/srv/tiny", role="share", state="zombie") == 0


def test_without_inventory_each_model_found_is_logged_once_with_how_it_was_found(caplog):
    processes = table(proc(1, 0, ["/sbin/init"]), proc(10, 1, rank_argv(model="/srv/tiny")))
    collector = ProcessesCollector(
        node="x", inventory=None, state_dir=Path("/nonexistent"),
        table=StaticTable(processes), clock=lambda: 0.0, established=lambda sshd: True,
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
    collector = ProcessesCollector(node="x", inventory=None, state_dir=tmp_path,
                                   table=table_, clock=lambda: 0.0,
                                   established=lambda sshd: None)
    assert list(collector.collect())


def test_a_command_line_with_odd_bytes_never_fails_a_scrape(tmp_path: Path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, ["/sbin/init"])
    fake.add(10, 1, b"/usr/bin/python3\0-m\0mlx_lm.server\0--model\0/srv/\xff\xfe\x00bad\0")
    collector = ProcessesCollector(node="x", inventory=None, state_dir=tmp_path,
                                   table=fake_table(fake.root), clock=lambda: 0.0,
                                   established=lambda sshd: None)
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
            [sys.executable, "-m", "mlx_medic.cli", "exporter", "--once",
             "--state-dir", str(tmp_path)],
            cwd=REPO, capture_output=True, timeout=120, check=True,
        )
    finally:
        rank.kill()
        rank.wait()
    assert f'mlx_processes{{model="{model}",role="rank",state="sleeping"}} 1.0'.encode() \
        in scrape.stdout
    check = subprocess.run([promtool, "check", "metrics"], input=scrape.stdout,
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
