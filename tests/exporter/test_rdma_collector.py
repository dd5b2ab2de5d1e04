"""The rdma collector and its parsers, on verbatim macOS outputs.

Every fixture in tests/fixtures/macos/ starts with `#` lines naming its source;
the rest is the tool's output byte for byte.
"""

from __future__ import annotations

import logging
import shutil
import sys

import pytest

from mlx_medic.exporter.collector import ScrapeCollector, sample_value
from mlx_medic.exporter.collectors.rdma import RdmaCollector
from mlx_medic.platform.commands import (
    CommandError,
    CommandNotFound,
    CompletedCommand,
    ParseError,
    run_command,
)
from mlx_medic.platform.macos_rdma import (
    IBV_DEVINFO_ARGV,
    IOCLASSCOUNT_ARGV,
    RdmaPort,
    parse_ibv_devinfo,
    parse_ioclasscount,
    rdma_object_counts,
)
from tests.exporter.macos_commands import FakeRunner, macos_output, ok


def missing(argv: tuple[str, ...]) -> CommandNotFound:
    return CommandNotFound(f"{argv[0]} is not installed on this host")


def scrape(collector: RdmaCollector) -> list[object]:
    return list(ScrapeCollector([collector]).collect())


# --- parsers ------------------------------------------------------------------


def test_apple_tn3205_ibv_devinfo_reads_three_active_ports_despite_apples_elisions():
    ports = parse_ibv_devinfo(macos_output("ibv_devinfo_tn3205.txt"))
    assert ports == [
        RdmaPort("rdma_en2", 1, "PORT_ACTIVE"),
        RdmaPort("rdma_en3", 1, "PORT_ACTIVE"),
        RdmaPort("rdma_en4", 1, "PORT_ACTIVE"),
    ]
    assert all(port.active for port in ports)


def test_tab_indented_ibv_devinfo_from_an_m5_max_reads_every_port_down():
    ports = parse_ibv_devinfo(macos_output("ibv_devinfo_m5max_tabs.txt"))
    assert [(p.device, p.port, p.state) for p in ports] == [
        ("rdma_en1", 1, "PORT_DOWN"),
        ("rdma_en6", 1, "PORT_DOWN"),
        ("rdma_en2", 1, "PORT_DOWN"),
    ]
    assert not any(port.active for port in ports)


def test_ibv_devinfo_with_no_devices_means_no_ports():
    assert parse_ibv_devinfo("No IB devices found\n") == []


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "\x00\x01\xff binary junk \x7f",
        "Segmentation fault: 11\n",
        "state: PORT_ACTIVE (4)\n",
    ],
)
def test_ibv_devinfo_garbage_is_a_parse_error_that_quotes_it(garbage):
    with pytest.raises(ParseError, match="ibv_devinfo"):
        parse_ibv_devinfo(garbage)


def test_a_state_outside_any_port_is_a_parse_error_naming_the_line():
    with pytest.raises(ParseError, match="line 2"):
        parse_ibv_devinfo("hca_id:\trdma_en2\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n")


def test_a_device_name_that_could_not_be_a_label_is_a_parse_error():
    with pytest.raises(ParseError, match="not a device name"):
        parse_ibv_devinfo('hca_id:\trdma en2 "quoted"\n')


def test_ioclasscount_man_page_example_reads_both_classes_from_one_comma_line():
    assert parse_ioclasscount(macos_output("ioclasscount_manpage.txt")) == {
        "IOPCIDevice": 2,
        "AppleTestPCI": 1,
    }


def test_ioclasscount_zero_instances_is_a_real_zero():
    assert parse_ioclasscount(macos_output("ioclasscount_zero.txt")) == {"HHKPS2USBDriver": 0}


def test_ioclasscount_no_such_class_is_none_not_zero():
    assert parse_ioclasscount(macos_output("ioclasscount_no_such_class.txt")) == {
        "HHKPS2USBDriver": None,
    }


def test_rdma_object_counts_from_the_reconstructed_two_class_line():
    # ioclasscount_rdma_reconstructed.txt is marked [R]: the format is verbatim
    # (man page, ioclasscount.c), the class names from dryvist/nix-ai, the numbers made up.
    counts = rdma_object_counts(macos_output("ioclasscount_rdma_reconstructed.txt"))
    assert counts == {"protection_domain": 3, "queue_pair": 6}


def test_rdma_object_counts_leave_out_a_class_the_kernel_does_not_know():
    text = (
        "AppleThunderboltRDMAProtectionDomain = <no such class>, "
        "AppleThunderboltRDMAQueuePair = <no such class>\n"
    )
    assert rdma_object_counts(text) == {}


def test_rdma_object_counts_reject_output_that_lacks_a_class():
    with pytest.raises(ParseError, match="AppleThunderboltRDMAQueuePair"):
        rdma_object_counts("AppleThunderboltRDMAProtectionDomain = 3\n")


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "open (ipc/send) invalid destination port, need DEVELOPMENT kernel\n",
        "IOPCIDevice = two\n",
        "\x00\xff\xfe",
    ],
)
def test_ioclasscount_garbage_is_a_parse_error(garbage):
    with pytest.raises(ParseError, match="ioclasscount"):
        parse_ioclasscount(garbage)


def test_an_unreadable_count_is_a_parse_error_not_a_zero():
    with pytest.raises(ParseError, match="could not read"):
        parse_ioclasscount("IOPCIDevice = ?? (error reading/converting value)\n")


# --- the collector ------------------------------------------------------------


def test_collector_reports_port_state_and_object_counts_from_the_tools():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, macos_output("ibv_devinfo_tn3205.txt")),
            IOCLASSCOUNT_ARGV: ok(
                IOCLASSCOUNT_ARGV, macos_output("ioclasscount_rdma_reconstructed.txt")
            ),
        }
    )
    families = scrape(RdmaCollector(runner=runner, timeout=3.0))
    for device in ("rdma_en2", "rdma_en3", "rdma_en4"):
        assert (
            sample_value(families, "mlx_rdma_port_active", {"device": device, "port": "1"}) == 1.0
        )
    assert sample_value(families, "mlx_rdma_objects", {"kind": "protection_domain"}) == 3.0
    assert sample_value(families, "mlx_rdma_objects", {"kind": "queue_pair"}) == 6.0
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 1.0


def test_collector_runs_fixed_argv_with_its_timeout():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, macos_output("ibv_devinfo_m5max_tabs.txt")),
            IOCLASSCOUNT_ARGV: ok(
                IOCLASSCOUNT_ARGV, macos_output("ioclasscount_rdma_reconstructed.txt")
            ),
        }
    )
    scrape(RdmaCollector(runner=runner, timeout=3.0))
    assert runner.calls == [
        (("ibv_devinfo",), 3.0),
        (
            (
                "ioclasscount",
                "AppleThunderboltRDMAProtectionDomain",
                "AppleThunderboltRDMAQueuePair",
            ),
            3.0,
        ),
    ]


def test_down_ports_read_zero():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, macos_output("ibv_devinfo_m5max_tabs.txt")),
            IOCLASSCOUNT_ARGV: missing(IOCLASSCOUNT_ARGV),
        }
    )
    families = scrape(RdmaCollector(runner=runner))
    assert (
        sample_value(families, "mlx_rdma_port_active", {"device": "rdma_en6", "port": "1"}) == 0.0
    )


def test_without_the_tools_the_series_are_absent_and_the_collector_succeeds():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: missing(IBV_DEVINFO_ARGV),
            IOCLASSCOUNT_ARGV: missing(IOCLASSCOUNT_ARGV),
        }
    )
    families = scrape(RdmaCollector(runner=runner))
    names = {s.name for f in families for s in getattr(f, "samples", [])}
    assert not {"mlx_rdma_port_active", "mlx_rdma_objects"} & names
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 1.0


@pytest.mark.skipif(sys.platform == "darwin", reason="a Linux host has no RDMA tools")
def test_on_this_linux_host_the_real_tools_are_absent_so_are_the_series():
    if shutil.which("ibv_devinfo") or shutil.which("ioclasscount"):
        pytest.skip("this host has RDMA tools installed")
    families = scrape(RdmaCollector())  # the real runner
    names = {s.name for f in families for s in getattr(f, "samples", [])}
    assert not {"mlx_rdma_port_active", "mlx_rdma_objects"} & names
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 1.0


def test_ioclasscount_no_such_class_leaves_the_object_series_absent_not_zero():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, "No IB devices found\n"),
            IOCLASSCOUNT_ARGV: ok(
                IOCLASSCOUNT_ARGV,
                "AppleThunderboltRDMAProtectionDomain = <no such class>, "
                "AppleThunderboltRDMAQueuePair = <no such class>\n",
            ),
        }
    )
    families = scrape(RdmaCollector(runner=runner))
    names = {s.name for f in families for s in getattr(f, "samples", [])}
    assert not {"mlx_rdma_port_active", "mlx_rdma_objects"} & names
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 1.0


def test_rdma_core_no_devices_exit_status_is_not_a_failure():
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: CompletedCommand(IBV_DEVINFO_ARGV, 255, "", "No IB devices found\n"),
            IOCLASSCOUNT_ARGV: missing(IOCLASSCOUNT_ARGV),
        }
    )
    families = scrape(RdmaCollector(runner=runner))
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 1.0


@pytest.mark.parametrize(
    "bad_answer, logged",
    [
        (CommandError("`ibv_devinfo` did not finish within 5s"), "did not finish"),
        (
            CompletedCommand(IBV_DEVINFO_ARGV, 1, "", "Failed to get IB devices list\n"),
            "exited with status 1: Failed to get IB devices list",
        ),
        (CompletedCommand(IBV_DEVINFO_ARGV, 0, "\x00\xff\xfe garbage", ""), "no `hca_id:` line"),
    ],
)
def test_ibv_devinfo_that_fails_hangs_or_prints_garbage_fails_the_collector_with_a_log_line(
    bad_answer, logged, caplog
):
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: bad_answer,
            IOCLASSCOUNT_ARGV: ok(
                IOCLASSCOUNT_ARGV, macos_output("ioclasscount_rdma_reconstructed.txt")
            ),
        }
    )
    with caplog.at_level(logging.ERROR, logger="mlx_medic.exporter"):
        families = scrape(RdmaCollector(runner=runner))
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 0.0
    assert "collector rdma failed" in caplog.text
    assert logged in caplog.text


def test_ioclasscount_failure_fails_the_collector_rather_than_reading_zero(caplog):
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, macos_output("ibv_devinfo_tn3205.txt")),
            IOCLASSCOUNT_ARGV: CompletedCommand(
                IOCLASSCOUNT_ARGV, 71, "", "Error: Can't get registry root.\n"
            ),
        }
    )
    with caplog.at_level(logging.ERROR, logger="mlx_medic.exporter"):
        families = scrape(RdmaCollector(runner=runner))
    assert sample_value(families, "mlx_medic_collector_success", {"collector": "rdma"}) == 0.0
    assert sample_value(families, "mlx_rdma_objects", {"kind": "protection_domain"}) is None
    assert "Can't get registry root" in caplog.text


# --- the command runner (real processes) --------------------------------------


def test_run_command_returns_output_and_status_without_a_shell():
    result = run_command([sys.executable, "-c", "print('a;b $HOME')"], timeout=30)
    assert (result.returncode, result.stdout) == (0, "a;b $HOME\n")


def test_run_command_kills_a_command_that_hangs_and_names_it():
    with pytest.raises(CommandError, match=r"did not finish within 0\.5s"):
        run_command([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_run_command_reports_a_missing_tool_as_not_installed():
    with pytest.raises(CommandNotFound, match="not installed"):
        run_command(["mlx-medic-no-such-tool-7f3a"], timeout=5)


def test_run_command_turns_binary_output_into_text_instead_of_crashing():
    result = run_command(
        [sys.executable, "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))"], timeout=30
    )
    assert result.returncode == 0 and "\ufffd" in result.stdout
