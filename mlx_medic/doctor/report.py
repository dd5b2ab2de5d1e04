"""The doctor's report: a header naming the machine, a line per check, the facts no real
Mac has confirmed yet, and a summary; as text to paste into an issue, or one JSON
document."""

from __future__ import annotations

import platform as host_platform
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from mlx_medic.command_line import EXIT_FAILED, EXIT_OK, version
from mlx_medic.doctor import linux_facts, macos_facts, node_setup
from mlx_medic.doctor.framework import (
    CHECKS,
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    SKIPPED,
    Check,
    CheckResult,
    DoctorContext,
    run_checks,
)

CHECK_MODULES = (macos_facts, linux_facts, node_setup)  # each registers its checks on import
SCHEMA = 1
LABELS = {PASSED: "PASS", FAILED: "FAIL", NOT_APPLICABLE: "N/A", SKIPPED: "SKIP"}
UNVERIFIED_TITLE = "still unverified on real hardware"
CONFIRM = "(confirm them in the issue when they pass on a Mac)"


@dataclass(frozen=True)
class Report:
    header: dict[str, str]
    results: list[CheckResult]
    unverified: dict[str, str]  # check name -> the fact no real Mac has confirmed

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if any(r.status == FAILED for r in self.results) else EXIT_OK

    def counts(self) -> dict[str, int]:
        seen = Counter(r.status for r in self.results)
        return {status: seen[status] for status in LABELS}

    def summary(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        verdict = "something differs from what mlx-medic assumes" if self.exit_code else "ok"
        return f"{len(self.results)} results: {counts}: {verdict}"

    def text(self) -> str:
        lines = ["mlx-medic doctor", *(f"  {k}: {v}" for k, v in self.header.items()), ""]
        width = max(map(len, LABELS.values())) + 2
        section = ""
        for result in self.results:
            if result.section != section:
                section = result.section
                lines += [f"node {section}:"] if lines[-1] == "" else ["", f"node {section}:"]
            lines.append(f"{LABELS[result.status]:<{width}}{result.name}: {result.detail}")
            if result.fix:
                lines.append(f"{'':<{width}}fix: {result.fix}")
        if self.unverified:
            lines += ["", f"{UNVERIFIED_TITLE} {CONFIRM}:"]
            lines += [f"  {name}: {fact}" for name, fact in self.unverified.items()]
        return "\n".join([*lines, "", f"summary: {self.summary()}"])

    def document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": "doctor",
            "header": self.header,
            "checks": [
                {
                    **({"node": r.section} if r.section else {}),
                    "name": r.name,
                    "status": r.status,
                    "detail": r.detail,
                    "fix": r.fix,
                }
                for r in self.results
            ],
            "unverified_on_hardware": self.unverified,
            "counts": self.counts(),
            "summary": self.summary(),
            "exit": self.exit_code,
        }


def os_line(context: DoctorContext) -> str:
    from mlx_medic.node.facts import os_build

    facts = os_build(context.runner(), context.platform)
    if context.platform == "darwin":
        build = facts.get("build") or facts.get("build_error")
        return f"macOS build {build} (Darwin {facts['release']})"
    return str(facts["build"])


def header(context: DoctorContext, node_source: str) -> dict[str, str]:
    return {
        "mlx-medic": version(),
        "os": os_line(context),
        "python": f"{host_platform.python_version()} ({sys.executable})",
        "node": f"{context.node.name} ({node_source})" if context.node else "none (no --inventory)",
        "inventory": str(context.inventory_path) if context.inventory_path else "none",
        "user": context.user,
    }


def all_checks() -> list[Check]:
    """Every check, in the order the report lists them."""
    return list(CHECKS.values())


def build_report(
    context: DoctorContext, node_source: str = "", checks: list[Check] | None = None
) -> Report:
    checks = all_checks() if checks is None else checks
    unverified = {c.name: c.unverified for c in checks if c.unverified_on_hardware}
    return Report(header(context, node_source), run_checks(context, checks), unverified)
