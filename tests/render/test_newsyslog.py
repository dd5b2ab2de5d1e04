"""newsyslog.d entries for every log a rendered launchd job writes (the serve wrappers'
logs, the exporter's and the remediator's own and launchd's stderr files), and what
follows a log across what newsyslog does to it (newsyslog.conf(5): `x.log` renamed to
`x.log.0`, older archives shifted to `.1`, ..., an empty `x.log` created): the logs
collector, while launchd keeps writing to the renamed file until the job respawns, and
the exporter's and the remediator's own log (`--log.file`), which moves to the new file."""

from __future__ import annotations

import logging
import plistlib
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.exporter.collector import sample_value
from mlx_medic.exporter.collectors.logs import LogsCollector
from mlx_medic.logs import setup_logging
from mlx_medic.signatures import BUILTIN
from tests.render.helpers import model, render, render_example, write_inventory

PD = b"RuntimeError: [jaccl] Couldn't allocate protection domain\n"
MEDIC = "/opt/mlx-medic/bin/mlx-medic"


def entries(path: Path) -> dict[str, list[str]]:
    """log file -> the rest of its line."""
    lines = [line.split() for line in path.read_text().splitlines() if not line.startswith("#")]
    return {line[0]: line[1:] for line in lines}


def job_logs(plist: Path) -> tuple[set[str], str | None]:
    """Every file a launchd job writes a log to, and the user it runs as."""
    with plist.open("rb") as handle:
        job = plistlib.load(handle)
    argv = job["ProgramArguments"]
    logs = {value for flag, value in pairwise(argv) if flag == "--log.file"}
    logs |= {job[key] for key in ("StandardOutPath", "StandardErrorPath") if key in job}
    return logs, job.get("UserName")


def newsyslog_file(out: Path, plist: Path) -> Path:
    """The newsyslog file installed beside the plist: its node's, or the remediator's."""
    host = plist.parent.relative_to(out / "launchd")
    if host == Path("."):
        return out / "newsyslog" / "mlx-medic-remediator.conf"
    return out / "newsyslog" / host / "mlx-medic.conf"


def test_every_log_a_rendered_launchd_job_writes_is_rotated_where_the_job_runs(tmp_path: Path):
    out = render_example("all", tmp_path)
    plists = sorted((out / "launchd").rglob("*.plist"))
    rotated: dict[Path, set[str]] = {}
    for plist in plists:
        logs, user = job_logs(plist)
        assert logs, plist
        conf = newsyslog_file(out, plist)
        lines = entries(conf)
        assert logs <= set(lines), f"{plist}: {logs - set(lines)} not rotated in {conf}"
        for log in logs:  # newsyslog creates the new file as the job's user
            assert lines[log][0] == (f"{user}:" if user else "644"), (log, lines[log])
        rotated.setdefault(conf, set()).update(logs)
    confs = set((out / "newsyslog").rglob("*.conf"))
    assert confs == set(rotated)  # no file without a job
    assert all(set(entries(conf)) == logs for conf, logs in rotated.items())


def test_each_log_is_rotated_by_rename_past_100_mib_7_kept_with_no_signal_and_no_compression(
    tmp_path: Path,
):
    out = render_example("newsyslog", tmp_path) / "newsyslog"
    ai001 = entries(out / "ai001" / "mlx-medic.conf")
    assert ai001["/var/log/mlx-medic-exporter.log"] == ["644", "7", "102400", "*", "N"]
    assert ai001["/Users/ai/Library/Logs/mlx/glm-4_6-5b.err.log"] == [
        "ai:",
        "644",
        "7",
        "102400",
        "*",
        "N",
    ]
    remediator = entries(out / "mlx-medic-remediator.conf")
    assert remediator["/var/lib/mlx-medic-remediator/remediator.log"][0] == "mlx-medic:"
    for conf in out.rglob("*.conf"):
        for fields in entries(conf).values():
            assert fields[-5:] == ["644", "7", "102400", "*", "N"]


def test_a_systemd_models_logs_get_no_entry_and_its_nodes_exporters_do(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": MEDIC}},
        {"m1": model("systemd", "m1")},
    )
    code, _, err = render("newsyslog", inventory, tmp_path / "out")
    assert code == 0, err
    assert set(entries(tmp_path / "out" / "newsyslog" / "n1" / "mlx-medic.conf")) == {
        "/var/log/mlx-medic-exporter.log",
        "/var/log/mlx-medic-exporter.stderr.log",
    }


def test_a_log_path_with_whitespace_is_refused(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": MEDIC}},
        {"m1": model("launchd", "m1", log_files=["/Users/ai/My Logs/m1.log"])},
    )
    code, _, err = render("newsyslog", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "models.m1.log_files" in err


def rotate(log: Path) -> None:
    """What newsyslog does to one log: shift the archives, rename, create an empty log."""
    archives = sorted(log.parent.glob(f"{log.name}.*"), key=lambda p: -int(p.suffix[1:]))
    for archive in archives:
        archive.rename(log.with_name(f"{log.name}.{int(archive.suffix[1:]) + 1}"))
    log.rename(log.with_name(f"{log.name}.0"))
    log.write_bytes(b"")


def test_the_logs_collector_counts_every_line_across_two_newsyslog_rotations(tmp_path: Path):
    log = tmp_path / "glm.err.log"
    log.write_bytes(PD)
    collector = LogsCollector([str(log)], BUILTIN, tmp_path / "positions.json")

    def count() -> float | None:
        return sample_value(
            list(collector.collect()),
            "mlx_log_errors_total",
            {"signature": "jaccl_protection_domain", "file": str(log)},
        )

    assert count() == 1
    with log.open("ab") as launchd_stderr:  # the job's descriptor, opened at spawn
        launchd_stderr.write(PD)  # not yet read
        launchd_stderr.flush()
        rotate(log)
        launchd_stderr.write(PD)  # launchd still writes to the renamed file, x.log.0
        launchd_stderr.flush()
        assert count() == 3
        rotate(log)  # before the job respawned: its file is now x.log.1
        launchd_stderr.write(PD)
        launchd_stderr.flush()
        assert count() == 4
    with log.open("ab") as respawned:  # the job respawned: it opens x.log again
        respawned.write(PD * 2)
    assert count() == 6
    assert count() == 6
    collector.close()


@pytest.fixture
def root_logging() -> Iterator[None]:
    """setup_logging replaces the root logger's handlers: put pytest's back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:], root.level = handlers, level


def test_a_log_file_given_to_a_process_moves_to_the_new_file_after_a_newsyslog_rotation(
    tmp_path: Path, root_logging: None
):
    """What `--log.file` does in the exporter and the remediator (mlx_medic.logs): no
    signal needed, the next line after the rename goes to the new, empty file."""
    log = tmp_path / "mlx-medic-exporter.log"
    setup_logging("text", log)
    logger = logging.getLogger("mlx_medic.exporter")
    logger.info("before the rotation")
    rotate(log)
    logger.info("after the rotation")
    assert "before the rotation" in log.with_name(f"{log.name}.0").read_text()
    assert "after the rotation" not in log.with_name(f"{log.name}.0").read_text()
    assert "after the rotation" in log.read_text()
    log.rename(log.with_name(f"{log.name}.1"))  # renamed, and no new file made for it
    logger.info("after a bare rename")
    assert log.read_text().count("\n") == 1 and "after a bare rename" in log.read_text()
