"""macOS process state from `ps`, tested on verbatim macOS lines (tests/fixtures/macos/ps_*.txt).

psutil cannot see `U` on macOS; the seed's orphans are exactly the `Us+` ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.platform.proc_macos import (
    PS_STAT_WORD,
    MacProcessTable,
    PsParseError,
    parse_ps_axo,
    parse_ps_stat,
)
from mlx_medic.processes.info import Role, State

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "macos"


def fixture_lines(name: str) -> list[str]:
    """The sample's lines; a fixture must say where it came from."""
    lines = (FIXTURES / name).read_text().splitlines()
    assert lines[0].startswith("# source:"), f"{name} has no source header"
    return [line for line in lines if not line.startswith("#")]


def stat_word(line: str) -> str:
    """The STAT column of a `ps aux`-style line (the first word shaped like a state)."""
    return next(word for word in line.split()[1:] if PS_STAT_WORD.match(word))


def test_every_ps_fixture_names_its_source():
    names = sorted(p.name for p in FIXTURES.glob("ps_*.txt"))
    assert names
    for name in names:
        fixture_lines(name)


def test_the_seeds_us_plus_orphans_are_uninterruptible():
    lines = fixture_lines("ps_aux_seed_orphans.txt")
    assert [stat_word(line) for line in lines] == ["Us+", "Us+", "Us+"]
    assert {parse_ps_stat(stat_word(line)) for line in lines} == {State.UNINTERRUPTIBLE}


def test_backupd_in_u_with_raised_priority_is_uninterruptible():
    (line,) = fixture_lines("ps_aux_backupd_uninterruptible.txt")
    assert stat_word(line) == "U<s"
    assert parse_ps_stat("U<s") is State.UNINTERRUPTIBLE


def test_a_bare_u_from_ps_axo_state_is_uninterruptible():
    (line,) = fixture_lines("ps_axo_state_gopsutil.txt")
    assert parse_ps_stat(line) is State.UNINTERRUPTIBLE


def test_foreground_running_and_sleeping_processes():
    header, grep, mongo = fixture_lines("ps_aux_osx_10_8_foreground.txt")
    assert "STAT" in header.split()
    assert parse_ps_stat(stat_word(grep)) is State.RUNNING
    assert parse_ps_stat(stat_word(mongo)) is State.SLEEPING


def test_session_leaders_from_ps_o_pid_stat_are_sleeping():
    header, *rows = fixture_lines("ps_o_pid_stat_rlib.txt")
    assert header.split() == ["PID", "STAT"]
    assert {parse_ps_stat(row.split()[1]) for row in rows} == {State.SLEEPING}


def test_idle_stopped_and_zombie_letters_from_the_ps_man_page():
    # ps(1) (adv_cmds ps/ps.1): I idle, T stopped, Z zombie. No verbatim macOS
    # capture of these letters was found, so only the letters are tested.
    assert parse_ps_stat("I") is State.SLEEPING
    assert parse_ps_stat("T") is State.STOPPED
    assert parse_ps_stat("Z") is State.ZOMBIE
    assert parse_ps_stat("?") is None  # ps had no task port: fall back to psutil


def test_a_word_that_is_not_a_state_is_refused_with_its_text():
    with pytest.raises(PsParseError, match=r"'serve\.py'"):
        parse_ps_stat("serve.py")


def test_ps_axo_rows_keep_pid_ppid_and_state_and_skip_junk():
    rows = parse_ps_axo("    1     0 Ss\n  812     1 Us+\nPID PPID STAT\ngarbage\n  900   812 Q\n")
    assert {pid: (row.ppid, row.state) for pid, row in rows.items()} == {
        1: (0, State.SLEEPING),
        812: (1, State.UNINTERRUPTIBLE),
    }


# --- the table, with psutil and ps injected -------------------------------------------


class FakePsutilProcess:
    def __init__(self, pid, ppid, cmdline, *, status="running", env=None, created=1.0):
        self.info = {
            "pid": pid,
            "ppid": ppid,
            "name": Path(cmdline[0]).name,
            "create_time": created,
            "status": status,
        }
        self._cmdline = cmdline
        self._env = env or {}

    def cmdline(self):
        return self._cmdline

    def environ(self):
        return self._env


def test_the_macos_table_takes_state_from_ps_not_from_psutil():
    rank = ["/opt/mlx/bin/python3", "serve.py", "--model", "mlx-community/GLM-4.6-5bit"]
    processes = [
        FakePsutilProcess(1, 0, ["/sbin/launchd"]),
        FakePsutilProcess(700, 1, ["/usr/sbin/sshd"]),
        FakePsutilProcess(71233, 700, ["sshd: ai@ttys000"]),
        FakePsutilProcess(71234, 71233, rank, env={"MLX_RANK": "1"}),  # psutil: "running"
        FakePsutilProcess(900, 1, ["/usr/libexec/unrelated"]),
    ]
    ps_output = "    1     0 Ss\n  700     1 Ss\n71233   700 Us\n71234 71233 Us+\n  900     1 S\n"
    table = MacProcessTable(ps=lambda: ps_output, process_iter=lambda attrs: processes)
    snapshot = {p.pid: p for p in table.snapshot()}
    assert snapshot[71234].role is Role.RANK
    assert snapshot[71234].state is State.UNINTERRUPTIBLE
    assert snapshot[71234].ppid == 71233
    assert set(snapshot) == {1, 700, 71233, 71234}  # the rank and its ancestors only


def test_without_a_ps_row_psutil_is_trusted_only_for_zombie_and_stopped():
    rank = ["/opt/mlx/bin/python3", "-m", "mlx_lm.server"]
    processes = [
        FakePsutilProcess(1, 0, ["/sbin/launchd"]),
        FakePsutilProcess(10, 1, rank, status="zombie"),
        FakePsutilProcess(11, 1, rank, status="running"),
    ]
    table = MacProcessTable(
        ps=lambda: "    1     0 Ss\n   10     1 ?\n", process_iter=lambda attrs: processes
    )
    snapshot = {p.pid: p for p in table.snapshot()}
    assert snapshot[10].state is State.ZOMBIE
    assert snapshot[11].state is State.SLEEPING
