"""`mlx-medic node facts`: the node's memory, RDMA (absent is null, never a fake zero), the
MLX and mlx-lm versions, the OS build, a model's recent error lines with the signature
each matches and the serve wrapper's record of it. macOS readings come from verbatim
outputs in tests/fixtures/macos/."""

from __future__ import annotations

import sys
from importlib.metadata import distributions, version
from pathlib import Path

import pytest

from mlx_medic.node.facts import (
    SW_VERS_ARGV,
    installed_version,
    memory_facts,
    os_build,
    rdma_facts,
    recent_errors,
    versions,
)
from mlx_medic.node.log_marks import written_after
from mlx_medic.platform.commands import CommandError, CommandNotFound, CompletedCommand
from mlx_medic.platform.macos_memory import PRESSURE_ARGV, VM_STAT_ARGV
from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV, IOCLASSCOUNT_ARGV
from mlx_medic.serve.record import Failure, ServeRecord, write_serve_record
from mlx_medic.signatures import BUILTIN
from tests.exporter.macos_commands import FakeRunner, macos_output, ok
from tests.node.helper_runner import two_model_helpers

PD_ERROR = "RuntimeError: [jaccl] Couldn't allocate protection domain"


def test_on_macos_memory_reads_pressure_wired_and_compressor_as_the_exporter_does() -> None:
    runner = FakeRunner(
        {
            PRESSURE_ARGV: ok(PRESSURE_ARGV, macos_output("sysctl_pressure_level_critical.txt")),
            VM_STAT_ARGV: ok(VM_STAT_ARGV, macos_output("vm_stat_akka_2.txt")),
        }
    )
    facts = memory_facts(runner, "darwin")
    assert facts["available_bytes"] > 0 and facts["pressure_level"] == 4
    assert (facts["wired_bytes"], facts["compressor_bytes"]) == (852647 * 4096, 372004 * 4096)


def test_a_failing_macos_memory_tool_leaves_its_part_null_with_the_reason() -> None:
    failed = CompletedCommand(VM_STAT_ARGV, 1, "", "vm_stat: boom\n")
    runner = FakeRunner(
        {PRESSURE_ARGV: CommandError("sysctl did not finish within 5s"), VM_STAT_ARGV: failed}
    )
    facts = memory_facts(runner, "darwin")
    assert facts["pressure_level"] is None and "did not finish" in facts["pressure_level_error"]
    assert facts["wired_bytes"] is None and "vm_stat: boom" in facts["vm_stat_error"]


def test_on_linux_memory_runs_no_macos_tool() -> None:
    facts = memory_facts(FakeRunner({}), "linux")
    assert set(facts) == {"available_bytes"}


def test_rdma_ports_and_objects_from_verbatim_tool_outputs() -> None:
    runner = FakeRunner(
        {
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, macos_output("ibv_devinfo_m5max_tabs.txt")),
            IOCLASSCOUNT_ARGV: ok(
                IOCLASSCOUNT_ARGV, macos_output("ioclasscount_rdma_reconstructed.txt")
            ),
        }
    )
    facts = rdma_facts(runner)
    assert facts is not None
    assert [(p["device"], p["state"], p["active"]) for p in facts["ports"]] == [
        ("rdma_en1", "PORT_DOWN", False),
        ("rdma_en6", "PORT_DOWN", False),
        ("rdma_en2", "PORT_DOWN", False),
    ]
    assert facts["objects"] == {"protection_domain": 3, "queue_pair": 6}


def test_no_rdma_tool_means_no_rdma_not_an_error() -> None:
    runner = FakeRunner({IBV_DEVINFO_ARGV: CommandNotFound("ibv_devinfo is not installed")})
    assert rdma_facts(runner) is None


def test_a_broken_rdma_tool_is_an_error_not_no_rdma() -> None:
    broken = CompletedCommand(IBV_DEVINFO_ARGV, 1, "", "ibv_devinfo: segfault\n")
    facts = rdma_facts(FakeRunner({IBV_DEVINFO_ARGV: broken}))
    assert facts is not None and facts["ports"] is None and "exited with status 1" in facts["error"]


def test_the_macos_build_is_asked_of_sw_vers_and_a_failure_says_why() -> None:
    # No verbatim `sw_vers -buildVersion` output is in the shared reference, so this test
    # shows the command asked and the failure path; it invents no output.
    runner = FakeRunner({SW_VERS_ARGV: CommandNotFound("sw_vers is not installed on this host")})
    facts = os_build(runner, "darwin")
    assert runner.calls[0][0] == ("sw_vers", "-buildVersion")
    assert facts["build"] is None and "sw_vers is not installed" in facts["build_error"]


def test_the_linux_build_is_os_release_and_the_kernel(tmp_path: Path) -> None:
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    facts = os_build(FakeRunner({}), "linux", release)
    assert facts["build"].startswith("Debian GNU/Linux 12 (bookworm) (kernel ")
    assert os_build(FakeRunner({}), "linux", tmp_path / "missing")["source"] == "uname"


def test_a_version_is_read_from_the_dist_info_dir_the_import_would_find_first(
    tmp_path: Path,
) -> None:
    first, second, empty = tmp_path / "first", tmp_path / "second", tmp_path / "empty"
    installed = {
        first: ["mlx_lm-0.28.1.dist-info"],
        second: ["mlx-0.29.0.dist-info", "mlx_lm-0.20.0.dist-info", "mlx_metal-0.29.0.dist-info"],
        empty: [],
    }
    for entry, dists in installed.items():
        entry.mkdir()
        for dist in dists:
            (entry / dist).mkdir()
    path = [str(empty), str(tmp_path / "missing"), str(first), str(second)]
    assert installed_version("mlx-lm", path) == "0.28.1"  # the first entry holding it
    assert installed_version("mlx_lm", path) == "0.28.1"
    assert installed_version("MLX", path) == "0.29.0"  # not mlx_metal's
    assert installed_version("mlx-medic", path) is None
    assert versions(path)["mlx-lm"] == "0.28.1"


def test_a_version_agrees_with_importlib_metadata_for_every_installed_package() -> None:
    # version(): what imports find, the first on the path for a name installed twice
    for dist in distributions():
        name = dist.metadata["Name"]
        assert installed_version(name, sys.path) == version(name)


def test_an_egg_install_is_read_by_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    egg = tmp_path / "mlx_lm.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: mlx-lm\nVersion: 0.19.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_version("mlx-lm", [str(tmp_path)]) == "0.19.3"


def test_recent_errors_are_the_last_matching_lines_with_their_signature(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = ["INFO started", *(f"{PD_ERROR} #{i}" for i in range(5)), "INFO fine"]
    log.write_text("\n".join(lines) + "\n")
    errors, unreadable, sizes = recent_errors([log, tmp_path / "gone.log"], BUILTIN, 3)
    assert [e["line"] for e in errors] == [f"{PD_ERROR} #{i}" for i in (2, 3, 4)]
    assert {e["signature"] for e in errors} == {"jaccl_protection_domain"}
    assert errors[0]["file"] == str(log)
    assert list(unreadable) == [str(tmp_path / "gone.log")]
    assert sizes == {str(log): log.stat().st_size}


def test_each_error_line_says_the_byte_it_starts_at_even_in_a_cut_tail(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(
        b"INFO caf\xc3\xa9 started\r\n"
        + b"x" * 300
        + b"\n"
        + f"{PD_ERROR} #1\nINFO ok\n{PD_ERROR} #2\n".encode()
    )
    data = log.read_bytes()
    for tail in (1 << 20, 150):  # the whole file, and a tail that cuts a line
        errors, _unreadable, _sizes = recent_errors([log], BUILTIN, 10, tail_bytes=tail)
        assert [e["line"] for e in errors] == [f"{PD_ERROR} #1", f"{PD_ERROR} #2"]
        for error in errors:
            assert data[error["offset"] :].startswith(error["line"].encode())


@pytest.mark.parametrize(
    ("file", "offset", "marks", "sizes", "new"),
    [
        ("/l", 10, {"/l": 10}, {"/l": 40}, True),  # at the mark
        ("/l", 9, {"/l": 10}, {"/l": 40}, False),  # before it
        ("/l", 0, {"/l": None}, {"/l": 40}, True),  # no log before the start
        ("/l", 0, {"/l": 100}, {"/l": 40}, True),  # rotated since the start
        ("/other", 50, {"/l": 10}, {"/other": 90}, False),  # no mark of it
        ("/l", None, {"/l": 10}, {"/l": 40}, False),  # no offset
    ],
)
def test_a_line_is_new_when_written_after_its_logs_start_mark(
    file: str,
    offset: int | None,
    marks: dict[str, int | None],
    sizes: dict[str, int],
    new: bool,
) -> None:
    assert written_after(file, offset, marks, sizes) is new


def test_the_helper_reports_versions_os_and_the_models_log_errors(tmp_path: Path) -> None:
    log = tmp_path / "m1.log"
    log.write_text(f"{PD_ERROR}\n")
    helpers = two_model_helpers(tmp_path, m1=f"\n    log_files: [{log}]")
    document = helpers.document("facts", "m1", "--lines", "5")
    assert document["node"] == "n1" and document["model"] == "m1"
    assert document["memory"]["available_bytes"] > 0
    assert document["rdma"] is None  # this Linux host has no ibv_devinfo
    assert document["versions"]["mlx"] == version("mlx")
    assert document["versions"]["mlx-lm"] == version("mlx-lm")
    assert document["os"]["build"]
    assert document["log_errors"] == [
        {"file": str(log), "signature": "jaccl_protection_domain", "line": PD_ERROR, "offset": 0}
    ]
    assert document["log_sizes"] == {str(log): len(PD_ERROR) + 1}
    assert "log_errors" not in helpers.document("facts")  # no model: no logs
    assert helpers.run("facts", "m2").returncode == 2  # m2 is not placed on n1


def test_the_helper_reports_the_serve_wrappers_last_failed_start_jaccl_first(
    tmp_path: Path,
) -> None:
    """The fallback's evidence: a supervisor restarting a failing wrapper leaves a record
    in state starting, still carrying the last failed start's failures."""
    helpers = two_model_helpers(tmp_path)
    assert helpers.document("facts", "m1")["serve"] is None  # no wrapper ever ran
    write_serve_record(
        helpers.state,
        "m1",
        ServeRecord(
            "run-2",
            4242,
            None,
            "starting",
            backend="jaccl",
            failures=(
                Failure("ring", "n2", "ring did not answer"),
                Failure("jaccl", "n1", "smoke test failed", PD_ERROR),
            ),
            backend_reason="jaccl: the ledger leaves room",
            argv=("mlx.launch", "--backend"),
            reboot=("n2",),
            failed_starts=3,
        ),
    )
    assert helpers.document("facts", "m1")["serve"] == {
        "state": "starting",
        "backend": "jaccl",
        "failed_starts": 3,
        "failed_backends": ["ring", "jaccl"],
        "backend_reason": "jaccl: the ledger leaves room",
        "argv": ["mlx.launch", "--backend"],
        "reboot": ["n2"],
        "failure": {
            "backend": "jaccl",
            "host": "n1",
            "reason": "smoke test failed",
            "line": PD_ERROR,
        },
    }
