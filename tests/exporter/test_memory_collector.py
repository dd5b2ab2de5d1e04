"""The memory collector and the macOS memory parsers, on verbatim outputs."""

from __future__ import annotations

import logging
import sys

import psutil
import pytest

from mlx_medic.exporter.collector import ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.memory import MemoryCollector
from mlx_medic.platform.commands import CommandError, CommandNotFound, CompletedCommand, ParseError
from mlx_medic.platform.macos_memory import (
    PRESSURE_ARGV,
    VM_STAT_ARGV,
    parse_pressure_level,
    parse_vm_stat,
)
from tests.exporter.macos_commands import FakeRunner, macos_output, ok

MACOS_ONLY = {"mlx_memory_pressure_level", "mlx_memory_wired_bytes", "mlx_memory_compressor_bytes"}


def macos_collector(
    pressure: CompletedCommand | Exception, vm_stat: CompletedCommand | Exception
) -> MemoryCollector:
    return MemoryCollector(
        available_bytes=lambda: 123_456_789,
        platform="darwin",
        runner=FakeRunner({PRESSURE_ARGV: pressure, VM_STAT_ARGV: vm_stat}),
    )


def scrape(collector: MemoryCollector) -> list[object]:
    return list(ScrapeCollector([collector]).collect())


def sample_names(families: list[object]) -> set[str]:
    return {s.name for f in families for s in getattr(f, "samples", [])}


# --- parsers ------------------------------------------------------------------


def test_pressure_level_normal_and_critical_from_real_sysctl_output():
    assert parse_pressure_level(macos_output("sysctl_pressure_level_normal.txt")) == 1
    assert parse_pressure_level(macos_output("sysctl_pressure_level_critical.txt")) == 4


@pytest.mark.parametrize(
    "text, problem",
    [
        ("kern.memorystatus_vm_pressure_level: 3\n", "known levels are 1, 2 and 4"),
        ("kern.memorystatus_vm_pressure_level: high\n", "known levels"),
        ("sysctl: unknown oid 'kern.memorystatus_vm_pressure_level'\n", "not `kern."),
        ("", "printed nothing"),
        ("\x00\xff garbage\n", "not `kern."),
        (
            "kern.memorystatus_vm_pressure_level: 1\nkern.memorystatus_vm_pressure_level: 4\n",
            "not `kern.",
        ),
    ],
)
def test_pressure_level_rejects_anything_but_one_known_level(text, problem):
    with pytest.raises(ParseError, match=problem):
        parse_pressure_level(text)


def test_vm_stat_from_an_idle_intel_mac_gives_page_size_wired_and_compressor():
    stats = parse_vm_stat(macos_output("vm_stat_wazuh_22113.txt"))
    assert stats.page_size == 4096
    assert stats.wired_bytes == 715958 * 4096
    assert stats.compressor_bytes == 0
    assert stats.pages['"Translation faults"'] == 11477162
    assert len(stats.pages) == 22


def test_vm_stat_from_a_mac_under_pressure_counts_the_compressor():
    stats = parse_vm_stat(macos_output("vm_stat_akka_2.txt"))
    assert stats.wired_bytes == 852647 * 4096
    assert stats.compressor_bytes == 372004 * 4096
    assert stats.pages["Swapouts"] == 34330610


def test_vm_stat_takes_the_page_size_from_its_header_not_a_constant():
    text = macos_output("vm_stat_wazuh_22113.txt").replace(
        "page size of 4096", "page size of 16384"
    )
    assert parse_vm_stat(text).wired_bytes == 715958 * 16384


def test_vm_stat_ignores_lines_it_does_not_know():
    text = macos_output("vm_stat_akka_2.txt") + "Object cache: 478244 hits of 1592868 lookups\n"
    assert parse_vm_stat(text).wired_bytes == 852647 * 4096


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "printed nothing"),
        ("Pages free: 5.\n", "header"),
        ("Mach Virtual Memory Statistics: (page size of 4096 bytes)\n", "no counters"),
        (
            "Mach Virtual Memory Statistics: (page size of 1000 bytes)\nPages free: 1.\n",
            "power of two",
        ),
        ("\x00\x01\x02\xff", "header"),
    ],
)
def test_vm_stat_garbage_is_a_parse_error_that_says_what_is_wrong(text, problem):
    with pytest.raises(ParseError, match=problem):
        parse_vm_stat(text)


# --- the collector ------------------------------------------------------------


def test_on_linux_available_bytes_come_from_psutil_and_macos_series_are_absent():
    families = scrape(MemoryCollector(platform="linux"))
    value = sample_value(families, "mlx_memory_available_bytes", {})
    assert value is not None and 0 < value <= psutil.virtual_memory().total
    assert not MACOS_ONLY & sample_names(families)
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "memory"}) == 1.0


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the Linux default")
def test_the_default_platform_on_this_host_runs_no_macos_tools():
    def refuse(argv, timeout):
        raise AssertionError(f"ran {argv} on Linux")

    families = scrape(MemoryCollector(runner=refuse))
    assert not MACOS_ONLY & sample_names(families)


def test_on_macos_pressure_wired_and_compressor_are_reported():
    collector = macos_collector(
        ok(PRESSURE_ARGV, macos_output("sysctl_pressure_level_critical.txt")),
        ok(VM_STAT_ARGV, macos_output("vm_stat_akka_2.txt")),
    )
    families = scrape(collector)
    assert sample_value(families, "mlx_memory_available_bytes", {}) == 123_456_789
    assert sample_value(families, "mlx_memory_pressure_level", {}) == 4
    assert sample_value(families, "mlx_memory_wired_bytes", {}) == 852647 * 4096
    assert sample_value(families, "mlx_memory_compressor_bytes", {}) == 372004 * 4096


@pytest.mark.parametrize(
    "bad",
    [
        CommandError("`sysctl kern.memorystatus_vm_pressure_level` did not finish within 5s"),
        CommandNotFound("sysctl is not installed on this host"),
        CompletedCommand(PRESSURE_ARGV, 1, "", "sysctl: unknown oid\n"),
        CompletedCommand(PRESSURE_ARGV, 0, "\x00\xff\xfe", ""),
    ],
)
def test_a_failing_pressure_tool_leaves_only_its_series_out_with_a_log_line(bad, caplog):
    collector = macos_collector(bad, ok(VM_STAT_ARGV, macos_output("vm_stat_wazuh_22113.txt")))
    with caplog.at_level(logging.WARNING, logger="mlx_medic.exporter.memory"):
        families = scrape(collector)
    names = sample_names(families)
    assert "mlx_memory_pressure_level" not in names
    assert {"mlx_memory_available_bytes", "mlx_memory_wired_bytes"} <= names
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "memory"}) == 1.0
    assert "memory pressure level unavailable, series left out" in caplog.text


def test_a_failing_vm_stat_leaves_wired_and_compressor_out(caplog):
    collector = macos_collector(
        ok(PRESSURE_ARGV, macos_output("sysctl_pressure_level_normal.txt")),
        ok(VM_STAT_ARGV, "vm_stat: host_statistics64 failed\n"),
    )
    with caplog.at_level(logging.WARNING, logger="mlx_medic.exporter.memory"):
        families = scrape(collector)
    names = sample_names(families)
    assert not {"mlx_memory_wired_bytes", "mlx_memory_compressor_bytes"} & names
    assert sample_value(families, "mlx_memory_pressure_level", {}) == 1
    assert "vm_stat unavailable" in caplog.text


def test_the_same_tool_failure_is_logged_once_not_on_every_scrape(caplog):
    collector = macos_collector(
        CommandNotFound("sysctl is not installed on this host"),
        ok(VM_STAT_ARGV, macos_output("vm_stat_wazuh_22113.txt")),
    )
    with caplog.at_level(logging.WARNING, logger="mlx_medic.exporter.memory"):
        for _ in range(3):
            scrape(collector)
    assert caplog.text.count("memory pressure level unavailable") == 1


def test_psutil_failing_fails_the_collector_clearly(caplog):
    def broken() -> int:
        raise OSError("cannot read /proc/meminfo")

    with caplog.at_level(logging.ERROR, logger="mlx_medic.exporter"):
        families = scrape(MemoryCollector(available_bytes=broken, platform="linux"))
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "memory"}) == 0.0
    assert "cannot read /proc/meminfo" in caplog.text


# --- each placed model's room ---------------------------------------------------


def test_each_placed_model_gets_the_memory_a_rank_may_take_and_the_memory_it_needs(tmp_path):
    from mlx_medic.inventory.load import parse_inventory
    from mlx_medic.node.room import MEMORY_SEAM
    from mlx_medic.platform.macos_memory import WIRED_LIMIT_ARGV

    weights = tmp_path / "hub" / "m1"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"\0" * 1000)
    inventory = parse_inventory(f"""\
state_dir: {tmp_path}
nodes: {{n1: {{ssh: 10.0.0.1}}, n2: {{ssh: 10.0.0.2}}}}
models:
  m1:
    model: {weights}
    nodes: [n1, n2]
    port: 8080
    service: {{manager: launchd, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
  m2:
    model: org/m2
    nodes: [n1]
    port: 8081
    service: {{manager: launchd, label: m2}}
    backends: {{ring: {{hostfile: /etc/ring2.json}}}}
""")
    (tmp_path / MEMORY_SEAM).parent.mkdir()
    (tmp_path / MEMORY_SEAM).write_text("5000000000\n")
    collector = MemoryCollector(
        available_bytes=lambda: 123_456_789,
        platform="darwin",
        runner=FakeRunner(
            {
                PRESSURE_ARGV: CommandNotFound("sysctl"),
                VM_STAT_ARGV: CommandNotFound("vm_stat"),
                WIRED_LIMIT_ARGV: ok(
                    WIRED_LIMIT_ARGV, macos_output("sysctl_iogpu_wired_limit_mb_default.txt")
                ),
            }
        ),
        models=inventory.models_on("n1"),
        state_dir=tmp_path,
    )
    families = scrape(collector)
    for model in ("m1", "m2"):  # 0: no cap, the available memory is what a rank may take
        assert sample_value(families, "mlx_model_memory_free_bytes", {"model": model}) == 5e9
    # 1000 bytes of weights over two nodes, plus 20%; m2's weights are no local dir: unknown
    assert sample_value(families, "mlx_model_memory_needed_bytes", {"model": "m1"}) == 600
    assert sample_value(families, "mlx_model_memory_needed_bytes", {"model": "m2"}) is None
