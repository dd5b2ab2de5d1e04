"""newsyslog.d entries for the launchd models' service logs, and the logs collector
following a log across what newsyslog does to it (newsyslog.conf(5): `x.log` renamed to
`x.log.0`, older archives shifted to `.1`, ..., an empty `x.log` created) while launchd
keeps writing to the renamed file until the job respawns (macos-facts.md §1)."""

from __future__ import annotations

from pathlib import Path

from mlx_medic.exporter.collector import sample_value
from mlx_medic.exporter.collectors.logs import LogsCollector
from mlx_medic.inventory.load import load_inventory
from mlx_medic.signatures import BUILTIN
from tests.render.helpers import EXAMPLE, model, render, render_example, write_inventory

PD = b"RuntimeError: [jaccl] Couldn't allocate protection domain\n"


def entries(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if not line.startswith("#")]


def test_each_head_rotates_its_models_log_files_by_rename_with_no_signal_and_no_compression(
    tmp_path: Path,
):
    out = render_example("newsyslog", tmp_path) / "newsyslog"
    inventory = load_inventory(EXAMPLE)
    for head in ("ai001", "ai005"):
        lines = entries(out / head / "mlx-medic.conf")
        logs = [str(p) for m in inventory.models if m.head == head for p in m.log_files]
        assert [line[0] for line in lines] == logs
        for line in lines:
            # logfilename owner: mode count size(KB) when flags
            assert line[1:] == ["ai:", "644", "7", "102400", "*", "N"]


def test_only_launchd_models_get_entries(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml", {"n1": {"ssh": "127.0.0.2"}}, {"m1": model("systemd", "m1")}
    )
    code, _, err = render("newsyslog", inventory, tmp_path / "out")
    assert code == 0, err
    assert not (tmp_path / "out" / "newsyslog").exists()


def test_a_log_path_with_whitespace_is_refused(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2"}},
        {"m1": model("launchd", "m1", log_files=["/Users/ai/My Logs/m1.log"])},
    )
    code, _, err = render("newsyslog", inventory, tmp_path / "out")
    assert code == 1 and "models.m1.log_files" in err


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
