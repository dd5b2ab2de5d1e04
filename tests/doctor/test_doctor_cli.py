"""`mlx-medic doctor`: a report to paste into an issue (a header naming the machine, a line
per check with the fix under a failure, the facts no real Mac has confirmed, a summary),
or the same as one JSON document; exit 0 when nothing failed, 1 when a check failed, 2
when it could not start as asked."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from mlx_medic import __version__
from mlx_medic.cli import main
from mlx_medic.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from mlx_medic.doctor.framework import CHECKS
from mlx_medic.doctor.report import all_checks, build_report
from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV
from tests.doctor.fakes import Machine, context, fixture_output, inventory, ok


def doctor(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["doctor", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_text_report_has_a_header_a_line_per_check_the_unverified_facts_and_a_summary(
    tmp_path: Path,
):
    path = tmp_path / "inventory.yaml"
    inventory(path)
    machine = Machine({("sw_vers", "-buildVersion"): ok(("sw_vers", "-buildVersion"), "25B78\n")})
    report = build_report(context(machine, inventory_path=path), "--node")
    lines = report.text().splitlines()
    assert lines[:3] == ["mlx-medic doctor", f"  mlx-medic: {__version__}", lines[2]]
    assert lines[2].startswith("  os: macOS build 25B78 (Darwin ")
    assert "  node: ai001 (--node)" in lines and f"  inventory: {path}" in lines
    assert "FAIL  ibv-devinfo: ibv_devinfo is not installed; JACCL models here: glm" in lines
    fix = lines[
        lines.index("FAIL  ibv-devinfo: ibv_devinfo is not installed; JACCL models here: glm") + 1
    ]
    assert fix.startswith("      fix: enable RDMA over Thunderbolt")
    title = next(
        n for n, line in enumerate(lines) if line.startswith("still unverified on real hardware")
    )
    unverified = [c.name for c in all_checks() if c.unverified_on_hardware]
    assert [
        line.split(":")[0].strip() for line in lines[title + 1 : title + 1 + len(unverified)]
    ] == unverified
    assert lines[-1].startswith(f"summary: {len(report.results)} results: ")
    assert lines[-1].endswith("something differs from what mlx-medic assumes")
    assert report.exit_code == EXIT_FAILED


def test_nothing_failed_is_exit_0():
    tn3205 = fixture_output("ibv_devinfo_tn3205.txt")
    machine = Machine({IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, tn3205)})
    report = build_report(context(machine), checks=[CHECKS["ibv-devinfo"]])
    assert report.exit_code == EXIT_OK and report.summary().endswith(": ok")


def test_the_json_document_holds_the_same_report(tmp_path: Path):
    report = build_report(context(Machine()), checks=[CHECKS["ibv-devinfo"], CHECKS["ps-states"]])
    document = json.loads(json.dumps(report.document()))
    assert (document["schema"], document["command"], document["exit"]) == (1, "doctor", 1)
    assert [c["name"] for c in document["checks"]] == ["ibv-devinfo", "ps-states"]
    assert document["checks"][1]["status"] == "failed" and document["checks"][1]["fix"]
    assert document["unverified_on_hardware"] == {"ps-states": CHECKS["ps-states"].unverified}
    assert document["counts"] == {"passed": 0, "failed": 1, "not-applicable": 1, "skipped": 0}


def test_this_linux_machine_without_an_inventory_passes_as_json():
    code, out, err = doctor("--json")
    document = json.loads(out)
    assert (code, err) == (EXIT_OK, "")
    statuses = {c["name"]: c["status"] for c in document["checks"]}
    assert statuses["proc-states"] == "passed" and statuses["ps-states"] == "not-applicable"
    assert statuses["sudo-rule"] == "skipped"


def test_usage_errors_are_one_line_exit_2(tmp_path: Path):
    code, _, err = doctor("--inventory", str(tmp_path / "missing.yaml"))
    assert code == EXIT_USAGE and str(tmp_path / "missing.yaml") in err
    path = tmp_path / "inventory.yaml"
    inventory(path)
    code, _, err = doctor("--inventory", str(path), "--node", "ai009")
    assert code == EXIT_USAGE and "ai009" in err and "ai001, ai002" in err
    code, _, err = doctor("--inventory", str(path))  # no --node, no node-id file
    assert code == EXIT_USAGE and "node-id" in err
    code, _, err = doctor("--node", "ai001")
    assert (code, err) == (
        EXIT_USAGE,
        "mlx-medic doctor: --node names a node of the inventory: give --inventory FILE too\n",
    )
