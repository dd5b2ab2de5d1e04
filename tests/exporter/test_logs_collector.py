"""The logs collector: exact signature counts, read incrementally, across rotation and restarts."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest

from mlx_medic.exporter import log_follower, log_scanner
from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors import logs as logs_module
from mlx_medic.exporter.collectors.logs import ALERTED_SIGNATURES, LogsCollector, alert_ready
from mlx_medic.exporter.log_follower import FileHandle
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.signatures import BUILTIN, signature_set

PD = b"RuntimeError: [jaccl] Couldn't allocate protection domain\n"
TIMEOUT = (
    b"libc++abi: terminating due to uncaught exception of type std::runtime_error: "
    b"[METAL] Command buffer execution failed: Caused GPU Timeout Error "
    b"(00000002:kIOGPUCommandBufferCallbackErrorTimeout).\n"
)
NOISE = b'INFO:     127.0.0.1:52344 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'

REPO = Path(__file__).resolve().parents[2]
HAVE_HYPERSCAN = importlib.util.find_spec("hyperscan") is not None
ENGINES = [
    "find",
    pytest.param(
        "hyperscan",
        marks=pytest.mark.skipif(
            not HAVE_HYPERSCAN, reason="hyperscan is not installed (no wheel for this platform)"
        ),
    ),
]


class CountingHandle:
    def __init__(self, inner: FileHandle, opener: CountingOpener):
        self.inner, self.opener = inner, opener

    def stat(self) -> os.stat_result:
        return self.inner.stat()

    def pread(self, size: int, offset: int) -> bytes:
        data = self.inner.pread(size, offset)
        self.opener.bytes_read += len(data)
        return data

    def close(self) -> None:
        self.inner.close()


class CountingOpener:
    """Opens files for real and counts every byte read; can refuse chosen paths."""

    def __init__(self, refuse: set[str] | None = None):
        self.bytes_read = 0
        self.refuse = refuse or set()

    def __call__(self, path: str) -> CountingHandle:
        if path in self.refuse:
            raise PermissionError(13, "Permission denied", path)
        return CountingHandle(FileHandle(path), self)


def make_collector(files, state_dir: Path, engine: str = "find", **kwargs) -> LogsCollector:
    kwargs.setdefault("opener", CountingOpener())
    return LogsCollector(
        [str(f) for f in files], BUILTIN, state_dir / "logs-positions.json", engine=engine, **kwargs
    )


def count(collector: LogsCollector, path: Path, signature: str = "jaccl_protection_domain"):
    families = list(collector.collect())
    return sample_value(
        families, "mlx_log_errors_total", {"signature": signature, "file": str(path)}
    )


def readable(collector: LogsCollector, path: Path) -> float | None:
    return sample_value(list(collector.collect()), "mlx_log_file_readable", {"file": str(path)})


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    return tmp_path / "logs" / "model.err.log"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_alerted_signatures_start_at_zero_in_every_file_and_the_others_with_their_first_line(
    log_file, state_dir, engine
):
    log_file.write_bytes(NOISE * 3)
    other = log_file.with_name("model.out.log")
    collector = make_collector([log_file, other], state_dir, engine)
    families = list(collector.collect())
    for path in (log_file, other):
        for signature in BUILTIN:
            labels = {"signature": signature.name, "file": str(path)}
            expected = 0 if signature.name in ALERTED_SIGNATURES else None
            assert sample_value(families, "mlx_log_errors_total", labels) == expected
    assert sample_value(families, "mlx_log_file_readable", {"file": str(log_file)}) == 1
    assert sample_value(families, "mlx_log_file_readable", {"file": str(other)}) == 0
    with log_file.open("ab") as log:
        log.write(b"[ring] connection to a peer was lost\n")
    assert count(collector, log_file, "ring_peer_lost") == 1
    assert count(collector, other, "ring_peer_lost") is None


def test_every_signature_a_shipped_alert_reads_starts_at_zero():
    """increase() cannot see the first count of a counter that appears with it."""
    rules = (REPO / "alerting-rules" / "mlx-medic.rules.yaml").read_text()
    read = set(re.findall(r'mlx_log_errors_total\{[^}]*signature="(\w+)"', rules))
    assert read and read <= ALERTED_SIGNATURES


def test_a_signature_the_inventory_lists_starts_at_zero_too():
    inventory = parse_inventory(
        "nodes: {n1: {ssh: 127.0.0.1}}\nmodels: {}\n"
        "signatures: [{name: port_in_use, pattern: 'Address already in use'},"
        " {name: ring_peer_lost, pattern: 'peer lost'}]\n"
    )
    assert alert_ready(inventory) == ALERTED_SIGNATURES | {"port_in_use", "ring_peer_lost"}
    assert alert_ready(None) == ALERTED_SIGNATURES


@pytest.mark.parametrize("engine", ENGINES)
def test_a_line_with_two_signatures_counts_for_both_and_a_repeated_one_counts_once(
    log_file, state_dir, engine
):
    log_file.write_bytes(
        NOISE
        + b"[jaccl] Couldn't allocate protection domain [ring] connection to a peer was lost\n"
        + b"[jaccl] Couldn't allocate protection domain; [jaccl] Couldn't allocate protection "
        b"domain\n" + NOISE
    )
    collector = make_collector([log_file], state_dir, engine)
    assert count(collector, log_file) == 2
    assert count(collector, log_file, "ring_peer_lost") == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_only_the_bytes_added_since_the_last_scrape_are_read_and_counted(
    log_file, state_dir, engine
):
    log_file.write_bytes(NOISE * 100 + PD + TIMEOUT)
    opener = CountingOpener()
    collector = make_collector([log_file], state_dir, engine, opener=opener)
    assert count(collector, log_file) == 1
    assert count(collector, log_file, "metal_gpu_timeout") == 1
    before = opener.bytes_read
    append(log_file, PD + NOISE)
    assert count(collector, log_file) == 2
    assert count(collector, log_file, "metal_gpu_timeout") == 1
    # the second scrape above read the new lines plus the 4 KiB head; the third, the head only
    assert opener.bytes_read - before <= len(PD + NOISE) + 2 * log_follower.HEAD_BYTES


def test_a_partial_last_line_waits_for_its_newline(log_file, state_dir):
    log_file.write_bytes(NOISE + b"RuntimeError: [jaccl] Couldn't alloc")
    collector = make_collector([log_file], state_dir)
    assert count(collector, log_file) == 0
    append(log_file, b"ate protection domain\n")
    assert count(collector, log_file) == 1
    assert count(collector, log_file) == 1


def test_rename_rotation_finishes_the_old_file_and_keeps_reading_what_is_written_to_it(
    log_file, state_dir
):
    log_file.write_bytes(PD * 2)
    collector = make_collector([log_file], state_dir)
    assert count(collector, log_file) == 2
    append(log_file, PD)  # written before the rotation, not yet read
    log_file.rename(log_file.with_name("model.err.log.1"))
    log_file.write_bytes(PD)
    assert count(collector, log_file) == 4
    # launchd keeps writing to the renamed file until the job respawns
    append(log_file.with_name("model.err.log.1"), PD)
    assert count(collector, log_file) == 5
    log_file.with_name("model.err.log.1").unlink()
    append(log_file, PD)
    assert count(collector, log_file) == 6
    assert count(collector, log_file) == 6


def test_copy_truncate_recovers_the_lines_written_before_the_truncation_from_the_copy(
    log_file, state_dir
):
    log_file.write_bytes(b"2026-11-30 01:00:00 start\n" + PD * 2)
    collector = make_collector([log_file], state_dir)
    assert count(collector, log_file) == 2
    append(log_file, PD)  # not yet read when logrotate copies and truncates
    shutil.copyfile(log_file, log_file.with_name("model.err.log.1"))
    with open(log_file, "r+b") as f:
        f.truncate(0)
    append(log_file, PD)
    assert count(collector, log_file) == 4
    assert count(collector, log_file) == 4


def test_a_truncated_file_that_regrew_past_the_old_offset_is_still_read_from_its_start(
    log_file, state_dir
):
    log_file.write_bytes(b"2026-11-30 01:00:00 first run\n" + PD)
    collector = make_collector([log_file], state_dir)
    assert count(collector, log_file) == 1
    log_file.write_bytes(b"2026-11-30 02:00:00 second run\n" + NOISE * 5 + PD * 2)  # truncate
    assert count(collector, log_file) == 3


def test_a_vanished_file_is_finished_and_counted_again_when_it_comes_back(log_file, state_dir):
    log_file.write_bytes(PD * 2)
    collector = make_collector([log_file], state_dir)
    assert count(collector, log_file) == 2
    append(log_file, PD + b"[jaccl] Couldn't allocate protection domain")  # last line partial
    log_file.unlink()
    assert count(collector, log_file) == 4  # finished through the descriptor kept open
    assert readable(collector, log_file) == 0
    log_file.write_bytes(PD)
    assert count(collector, log_file) == 5
    assert readable(collector, log_file) == 1


def test_an_exporter_restart_resumes_from_the_saved_position(log_file, state_dir):
    log_file.write_bytes(PD * 2)
    first = make_collector([log_file], state_dir)
    assert count(first, log_file) == 2
    first.close()
    append(log_file, PD)
    second = make_collector([log_file], state_dir)
    assert count(second, log_file) == 3
    assert count(second, log_file) == 3
    second.close()


def test_a_restart_across_a_rotation_finds_the_old_file_by_its_inode(log_file, state_dir):
    log_file.write_bytes(PD * 2)
    first = make_collector([log_file], state_dir)
    assert count(first, log_file) == 2
    first.close()
    append(log_file, PD)  # while the exporter is down: written, rotated, new file started
    log_file.rename(log_file.with_name("model.err.log.1"))
    log_file.write_bytes(PD)
    second = make_collector([log_file], state_dir)
    assert count(second, log_file) == 4
    second.close()
    third = make_collector([log_file], state_dir)
    assert count(third, log_file) == 4
    third.close()


def test_the_state_file_is_small_json_replaced_atomically(log_file, state_dir):
    log_file.write_bytes(PD)
    collector = make_collector([log_file], state_dir)
    count(collector, log_file)
    saved = json.loads((state_dir / "logs-positions.json").read_text())
    entry = saved["files"][str(log_file)]
    assert entry["counts"]["jaccl_protection_domain"] == 1
    assert entry["current"]["offset"] == len(PD)
    assert entry["current"]["ino"] == log_file.stat().st_ino
    assert [p.name for p in state_dir.iterdir()] == ["logs-positions.json"]  # no temp left


def test_a_corrupt_state_file_is_reported_and_reading_starts_over(log_file, state_dir, caplog):
    state_dir.mkdir()
    (state_dir / "logs-positions.json").write_text("{not json")
    log_file.write_bytes(PD)
    with caplog.at_level(logging.WARNING):
        collector = make_collector([log_file], state_dir)
    assert "unusable" in caplog.text
    assert count(collector, log_file) == 1


def test_an_unwritable_state_dir_is_logged_and_counting_goes_on(log_file, tmp_path, caplog):
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    log_file.write_bytes(PD)
    collector = make_collector([log_file], blocker)  # the state file's parent is a file
    with caplog.at_level(logging.ERROR):
        assert count(collector, log_file) == 1
    assert "cannot save log positions" in caplog.text


def test_a_1mb_append_after_a_1gb_file_costs_about_1mb_of_reading(log_file, state_dir):
    with open(log_file, "wb") as f:  # sparse: 1 GiB of NULs (one long line), then a newline
        f.truncate(1 << 30)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + PD)
    try:
        opener = CountingOpener()
        collector = make_collector([log_file], state_dir, opener=opener, max_read_per_scrape=None)
        assert count(collector, log_file) == 1
        assert opener.bytes_read >= 1 << 30
        chunk = (NOISE * (1 << 20))[: (1 << 20) - len(PD)] + PD
        chunk = chunk[: chunk.rfind(b"\n", 0, len(chunk) - len(PD)) + 1] + PD
        append(log_file, chunk)
        before = opener.bytes_read
        assert count(collector, log_file) == 2
        spent = opener.bytes_read - before
        assert len(chunk) <= spent <= len(chunk) + log_follower.HEAD_BYTES
    finally:
        log_file.unlink()


def test_an_unreadable_log_is_a_skipped_entry_with_one_log_line(log_file, state_dir, caplog):
    log_file.write_bytes(PD)
    other = log_file.with_name("model.out.log")
    other.write_bytes(PD)
    opener = CountingOpener(refuse={str(log_file)})
    collector = make_collector([log_file, other], state_dir, opener=opener)
    scrape = ScrapeCollector([collector])
    with caplog.at_level(logging.WARNING):
        first = list(scrape.collect())
        second = list(scrape.collect())
    for families in (first, second):
        assert sample_value(families, "mlx_medic_collector_success", {"collector": "logs"}) == 1
        assert sample_value(families, "mlx_log_file_readable", {"file": str(log_file)}) == 0
        labels = {"signature": "jaccl_protection_domain", "file": str(other)}
        assert sample_value(families, "mlx_log_errors_total", labels) == 1
    assert caplog.text.count("Permission denied") == 1


def test_a_directory_where_the_log_should_be_is_a_skipped_entry(log_file, state_dir, caplog):
    log_file.mkdir()
    collector = make_collector([log_file], state_dir)
    with caplog.at_level(logging.WARNING):
        assert readable(collector, log_file) == 0
    assert "not a regular file" in caplog.text
    assert count(collector, log_file) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_binary_garbage_is_read_without_crashing_and_real_errors_in_it_still_count(
    log_file, state_dir, engine
):
    garbage = bytes(range(256)) * 64 + b"\xff\xfe\x00[jaccl]\x00\x80\n"
    log_file.write_bytes(garbage + PD + os.urandom(100_000).replace(b"\n", b" ") + b"\n" + PD)
    collector = make_collector([log_file], state_dir, engine)
    assert count(collector, log_file) == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_very_long_line_is_judged_by_its_head_and_never_buffered_whole(
    log_file, state_dir, engine
):
    cap = log_scanner.MAX_LINE_BYTES
    head_error = PD.rstrip(b"\n") + b" " + b"x" * (5 * cap) + b"\n"  # counted: error at the head
    tail_error = b"y" * (5 * cap) + PD  # not counted: the error is past the cap
    log_file.write_bytes(head_error + tail_error + PD)
    collector = make_collector([log_file], state_dir, engine)
    assert count(collector, log_file) == 2
    # a long line still being written: counted once, when its head is complete
    append(log_file, PD.rstrip(b"\n") + b"z" * (3 * cap))
    assert count(collector, log_file) == 3
    append(log_file, b"z" * cap + b"\n" + PD)
    assert count(collector, log_file) == 4


def test_an_inventory_signature_without_a_literal_is_counted_on_the_slow_path(log_file, state_dir):
    signatures = signature_set(
        parse_inventory(
            "nodes: {ai001: {ssh: 127.0.0.1}}\n"
            "signatures:\n"
            "  - {name: swap_storm, pattern: '(?i)swap(ping)? storm'}\n"
        ).signatures
    )
    log_file.write_bytes(NOISE + b"kernel: SWAP STORM detected\n" + b"swapping storm\n" + PD)
    collector = LogsCollector([str(log_file)], signatures, state_dir / "p.json", engine="find")
    assert count(collector, log_file, "swap_storm") == 2
    assert count(collector, log_file) == 1


def test_make_watches_the_logs_of_the_models_this_node_heads(tmp_path):
    err, peer_log = tmp_path / "glm.err.log", tmp_path / "qwq.err.log"
    inventory = parse_inventory(f"""
nodes: {{ai001: {{ssh: 127.0.0.1}}, ai002: {{ssh: 127.0.0.2}}}}
signatures: [{{name: custom_one, pattern: 'custom failure here'}}]
models:
  glm:
    model: m
    nodes: [ai001, ai002]
    port: 8080
    service: {{manager: supervisord, label: glm}}
    backends: {{ring: {{hostfile: /etc/h.json}}}}
    log_files: [{err}]
  qwq:
    model: m
    nodes: [ai002, ai001]
    port: 8081
    service: {{manager: supervisord, label: qwq}}
    backends: {{ring: {{hostfile: /etc/h.json}}}}
    log_files: [{peer_log}]
""")
    err.write_bytes(b"custom failure here\n" + PD)
    context = ExporterContext(node="ai001", inventory=inventory, state_dir=tmp_path / "state")
    collector = logs_module.make(context)
    families = list(collector.collect())
    assert (
        sample_value(
            families, "mlx_log_errors_total", {"signature": "custom_one", "file": str(err)}
        )
        == 1
    )
    assert sample_value(families, "mlx_log_file_readable", {"file": str(peer_log)}) is None
    collector.close()


def test_a_huge_backlog_is_read_over_several_scrapes_within_a_per_scrape_budget(
    log_file, state_dir
):
    lines = (NOISE * 2000 + PD) * 10  # ~1.5 MB holding 10 errors
    log_file.write_bytes(lines)
    opener = CountingOpener()
    collector = make_collector([log_file], state_dir, opener=opener, max_read_per_scrape=256 * 1024)
    seen, scrapes = [], 0
    while scrapes < 50:
        before = opener.bytes_read
        families = list(collector.collect())
        scrapes += 1
        assert opener.bytes_read - before <= 256 * 1024 + log_scanner.CHUNK_BYTES
        seen.append(
            sample_value(
                families,
                "mlx_log_errors_total",
                {"signature": "jaccl_protection_domain", "file": str(log_file)},
            )
        )
        if sample_value(families, "mlx_log_unread_bytes", {"file": str(log_file)}) == 0:
            break
    assert seen[-1] == 10
    assert seen == sorted(seen)  # a counter that only catches up
    assert len(seen) > 1


def test_a_deleted_file_with_a_backlog_is_finished_through_its_descriptor_on_later_scrapes(
    log_file, state_dir
):
    log_file.write_bytes(PD)
    collector = make_collector([log_file], state_dir, max_read_per_scrape=64 * 1024)
    assert count(collector, log_file) == 1
    append(log_file, (NOISE * 1000 + PD) * 4)  # ~300 KB: more than one scrape's budget
    log_file.unlink()
    counts = [count(collector, log_file) for _ in range(20)]
    assert counts[-1] == 5
