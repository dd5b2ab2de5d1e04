"""The doctor's macOS checks read this Mac's output with the product's own parsers: each
passes on a verbatim output in tests/fixtures/macos/ and fails, saying what to fix, on
another tool's output, a missing tool, or a setup that differs from the inventory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlx_medic.doctor.framework import CHECKS, FAILED, NOT_APPLICABLE, PASSED, SKIPPED, run_check
from mlx_medic.doctor.macos_facts import TIMEOUT  # noqa: F401  (registers the checks)
from mlx_medic.platform.commands import CompletedCommand, ParseError
from mlx_medic.platform.macos_launchd import parse_launchctl_print
from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV, IOCLASSCOUNT_ALL_ARGV, IOCLASSCOUNT_ARGV
from mlx_medic.platform.proc_macos import PS_COMMAND, PS_STAT_WORD
from mlx_medic.platform.temp_dirs import GETCONF_ARGV
from tests.doctor.fakes import Machine, context, fixture_output, inventory, ok

LAUNCHCTL_PRINT = ("/bin/launchctl", "print", "system/otelcol-sumo")


def results(name: str, machine: Machine, **kwargs):
    return run_check(CHECKS[name], context(machine, **kwargs))


def only(name: str, machine: Machine, **kwargs):
    (result,) = results(name, machine, **kwargs)
    return result


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    inventory(tmp_path / "inventory.yaml")
    return tmp_path / "inventory.yaml"


# --- ps states -------------------------------------------------------------------------------


def verbatim_stat_words() -> list[str]:
    """Every STAT word of the ps captures on file (ps aux, ps -o stat, ps -axo state)."""
    words = []
    for path in sorted(Path(__file__).parents[1].glob("fixtures/macos/ps_*.txt")):
        for line in fixture_output(path.name).splitlines():
            words += [w for w in line.split()[1:] or line.split() if PS_STAT_WORD.match(w)][:1]
    return words


def test_ps_rows_with_every_captured_state_word_pass_with_their_counts():
    # No capture of `ps -axo pid=,ppid=,stat=` itself exists (the check says so in the
    # report): the rows are `pid ppid stat` around the STAT words macOS printed.
    words = verbatim_stat_words()
    assert {"Us+", "U<s", "U", "R+", "S+", "Ss"} <= set(words)
    text = "".join(f"{100 + n:>5} {1:>5} {word}\n" for n, word in enumerate(words))
    result = only("ps-states", Machine({PS_COMMAND: ok(PS_COMMAND, text)}))
    assert result.status == PASSED, result
    assert result.detail.startswith(f"{len(words)} processes, states ")
    assert "U " in result.detail


def test_ps_aux_columns_instead_of_pid_ppid_stat_fail_quoting_a_line():
    text = fixture_output("ps_aux_osx_10_8_foreground.txt")
    result = only("ps-states", Machine({PS_COMMAND: ok(PS_COMMAND, text)}))
    assert result.status == FAILED
    assert "3 of 3 lines are not a `pid ppid stat` row" in result.detail
    assert "'USER" in result.detail and "PS_STATE_LETTERS" in result.fix


def test_a_state_letter_the_exporter_does_not_know_fails():
    text = "  101     1 Ss\n  102     1 Q\n"  # Q: no ps prints it; the check must say so
    result = only("ps-states", Machine({PS_COMMAND: ok(PS_COMMAND, text)}))
    assert result.status == FAILED and "1 of 2 lines" in result.detail and "'102" in result.detail


def test_ps_states_is_not_applicable_on_linux_and_says_where_linux_states_come_from():
    result = only("ps-states", Machine(), platform="linux")
    assert result.status == NOT_APPLICABLE and "proc-states" in result.detail


# --- ibv_devinfo -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ibv_devinfo_tn3205.txt", "ibv_devinfo_m5max_tabs.txt"])
def test_ibv_devinfo_captures_pass_naming_each_port_state(name: str, cluster: Path):
    machine = Machine({IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, fixture_output(name))})
    result = only("ibv-devinfo", machine, inventory_path=cluster)
    assert result.status == PASSED, result
    assert "port 1 PORT_" in result.detail and "JACCL models here: glm" in result.detail


def test_ibv_devinfo_missing_on_a_node_with_a_jaccl_model_fails_saying_how_to_enable_rdma(
    cluster: Path,
):
    result = only("ibv-devinfo", Machine(), inventory_path=cluster)
    assert result.status == FAILED
    assert result.detail == "ibv_devinfo is not installed; JACCL models here: glm"
    assert "rdma_ctl enable" in result.fix


def test_ibv_devinfo_missing_without_a_jaccl_model_is_not_applicable():
    assert only("ibv-devinfo", Machine()).status == NOT_APPLICABLE


def test_output_that_is_not_ibv_devinfos_fails_asking_for_it_in_an_issue(cluster: Path):
    garbled = fixture_output("ioclasscount_manpage.txt")
    machine = Machine({IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, garbled)})
    result = only("ibv-devinfo", machine, inventory_path=cluster)
    assert result.status == FAILED and "hca_id" in result.detail and "issue" in result.fix


# --- ioclasscount ----------------------------------------------------------------------------


def test_ioclasscount_of_both_rdma_classes_passes_with_the_counts(cluster: Path):
    # The only RDMA-class output on file is reconstructed: the report lists this check
    # as unverified on real hardware.
    text = fixture_output("ioclasscount_rdma_reconstructed.txt")
    machine = Machine({IOCLASSCOUNT_ARGV: ok(IOCLASSCOUNT_ARGV, text)})
    result = only("ioclasscount", machine, inventory_path=cluster)
    assert result.status == PASSED
    assert result.detail.startswith("protection_domain 3, queue_pair 6")
    assert CHECKS["ioclasscount"].unverified_on_hardware


def test_ioclasscount_without_the_rdma_classes_fails_naming_the_kernels_rdma_classes(
    cluster: Path,
):
    other_classes = fixture_output("ioclasscount_manpage.txt")  # IOPCIDevice, AppleTestPCI
    machine = Machine(
        {
            IOCLASSCOUNT_ARGV: ok(IOCLASSCOUNT_ARGV, other_classes),
            IOCLASSCOUNT_ALL_ARGV: ok(IOCLASSCOUNT_ALL_ARGV, other_classes),
        }
    )
    result = only("ioclasscount", machine, inventory_path=cluster)
    assert result.status == FAILED
    assert "ioclasscount did not report AppleThunderboltRDMAProtectionDomain" in result.detail


def test_classes_the_kernel_does_not_know_fail_on_a_jaccl_node_and_list_its_rdma_classes(
    cluster: Path,
):
    no_such = "AppleThunderboltRDMAProtectionDomain = <no such class>, "
    no_such += "AppleThunderboltRDMAQueuePair = <no such class>\n"  # the format of
    # ioclasscount_no_such_class.txt, for the two classes the exporter asks for
    machine = Machine(
        {
            IOCLASSCOUNT_ARGV: ok(IOCLASSCOUNT_ARGV, no_such),
            IOCLASSCOUNT_ALL_ARGV: ok(
                IOCLASSCOUNT_ALL_ARGV, fixture_output("ioclasscount_zero.txt")
            ),
        }
    )
    result = only("ioclasscount", machine, inventory_path=cluster)
    assert result.status == FAILED
    assert "no such class: AppleThunderboltRDMAProtectionDomain" in result.detail
    assert "the kernel's RDMA classes: none" in result.detail
    assert "paste this line into an issue" in result.fix


# --- the service user's temp dir ---------------------------------------------------------------


def test_getconf_asked_as_the_service_user_passes_with_its_temp_dir(cluster: Path):
    text = fixture_output("getconf_darwin_user_temp_dir.txt")
    machine = Machine({("_otelcol-sumo", GETCONF_ARGV): ok(GETCONF_ARGV, text)})
    result = only("user-temp-dir", machine, inventory_path=cluster)
    assert (result.name, result.status) == ("user-temp-dir _otelcol-sumo", PASSED)
    assert result.detail == "/var/folders/qg/s5jp5ffx2p1fxv0hy2l_p3hm0000gn/T"
    assert machine.calls == [("_otelcol-sumo", GETCONF_ARGV)]


def test_a_temp_dir_that_does_not_exist_fails(cluster: Path):
    text = fixture_output("getconf_darwin_user_temp_dir.txt")
    machine = Machine({("_otelcol-sumo", GETCONF_ARGV): ok(GETCONF_ARGV, text)})
    result = only("user-temp-dir", machine, inventory_path=cluster, is_dir=lambda p: False)
    assert result.status == FAILED and "is not a directory" in result.detail


def test_getconf_printing_something_else_fails(cluster: Path):
    garbled = fixture_output("vm_stat_wazuh_22113.txt")
    machine = Machine({("_otelcol-sumo", GETCONF_ARGV): ok(GETCONF_ARGV, garbled)})
    result = only("user-temp-dir", machine, inventory_path=cluster)
    assert result.status == FAILED and "not one absolute path" in result.detail
    assert "uncounted" in result.fix


def test_another_users_temp_dir_is_skipped_unless_the_doctor_runs_as_root(cluster: Path):
    machine = Machine()
    result = only("user-temp-dir", machine, inventory_path=cluster, user="ops")
    assert result.status == SKIPPED and "as root or as _otelcol-sumo" in result.detail
    assert machine.calls == []


def test_without_an_inventory_the_doctors_own_temp_dir_is_asked(tmp_path: Path):
    text = fixture_output("getconf_darwin_user_temp_dir_root.txt")
    machine = Machine({(None, GETCONF_ARGV): ok(GETCONF_ARGV, text)})
    result = only("user-temp-dir", machine)
    assert result.status == PASSED and result.detail.startswith("/var/folders/zz/")


# --- the model's launchd job ------------------------------------------------------------------


def test_launchctl_print_capture_parses_into_the_fields_the_doctor_compares():
    job = parse_launchctl_print(
        fixture_output("launchctl_print_otelcol_sumo.txt"), "system/otelcol-sumo"
    )
    assert job.path == "/Library/LaunchDaemons/com.sumologic.otelcol-sumo.plist"
    assert (job.username, job.state, job.fields["pid"]) == ("_otelcol-sumo", "running", "54109")
    assert job.arguments == (
        "/usr/local/bin/otelcol-sumo",
        "--config",
        "/etc/otelcol-sumo/sumologic.yaml",
        "--config",
        "glob:/etc/otelcol-sumo/conf.d/*.yaml",
    )
    assert "PATH" not in job.fields and job.fields["last exit code"] == "(never exited)"


def test_launchctl_print_of_another_job_or_a_cut_block_is_a_parse_error():
    text = fixture_output("launchctl_print_otelcol_sumo.txt")
    with pytest.raises(ParseError, match=re.escape("not `system/other = {`")):
        parse_launchctl_print(text, "system/other")
    with pytest.raises(ParseError, match="never closes"):
        parse_launchctl_print(text.rsplit("}", 1)[0], "system/otelcol-sumo")


def launchctl(stdout: str, code: int = 0, stderr: str = "") -> Machine:
    return Machine({LAUNCHCTL_PRINT: CompletedCommand(LAUNCHCTL_PRINT, code, stdout, stderr)})


def test_a_job_loaded_from_the_inventorys_plist_as_its_user_passes(cluster: Path):
    machine = launchctl(fixture_output("launchctl_print_otelcol_sumo.txt"))
    result = only("launchd-job", machine, inventory_path=cluster)
    assert (result.name, result.status) == ("launchd-job glm", PASSED), result
    assert result.detail == (
        "system/otelcol-sumo from /Library/LaunchDaemons/com.sumologic.otelcol-sumo.plist"
        " (state = running, pid 54109)"
    )


def test_a_job_that_is_not_loaded_fails_with_the_bootstrap_command(cluster: Path):
    machine = launchctl("", 113, "(stderr as launchctl printed it)")
    result = only("launchd-job", machine, inventory_path=cluster)
    assert result.status == FAILED and "exited 113" in result.detail
    assert "sudo launchctl bootstrap system /Library/LaunchDaemons/com.sumologic" in result.fix


def test_a_job_from_another_plist_as_another_user_running_something_else_fails(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    inventory(
        path,
        service={
            "manager": "launchd",
            "label": "otelcol-sumo",
            "user": "ai",
            "kind": "wrapper",
        },
    )
    machine = launchctl(fixture_output("launchctl_print_otelcol_sumo.txt"))
    result = only("launchd-job", machine, inventory_path=path)
    assert result.status == FAILED
    assert "the inventory's plist is /Library/LaunchDaemons/otelcol-sumo.plist" in result.detail
    assert "runs as _otelcol-sumo, service.user is ai" in result.detail
    assert (
        "render writes `/opt/mlx-medic/bin/mlx-medic serve glm --inventory"
        " /etc/mlx-medic/inventory.yaml`" in result.detail
    )
    assert "render launchd" in result.fix


def test_a_node_that_heads_no_launchd_model_has_no_job_to_check(cluster: Path):
    result = only("launchd-job", Machine(), inventory_path=cluster, node="ai002")
    assert result.status == NOT_APPLICABLE
