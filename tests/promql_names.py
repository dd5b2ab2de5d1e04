"""Metric names used by a PromQL expression, and the metric contract they must come from.

A small scanner rather than a PromQL parser: rules and dashboards only need "which metric
names does this expression read", and promtool (run separately) checks the syntax.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_FILE = ROOT / "alerting-rules" / "metrics.txt"

# Prometheus's own series that rules may use beside the contract.
BUILTIN_METRICS = frozenset({"up"})
# Series a histogram or summary exposes under its contract name.
_SUFFIXES = ("_bucket", "_sum", "_count")

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
# Numbers and durations first, so the `h` of `1h` is never read as a name.
_TOKENS = re.compile(r"\d[\w.]*|([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
        "atan2",
    }
)


def metric_names(expr: str) -> set[str]:
    """Every metric name the expression selects (functions, labels and keywords left out)."""
    text = _STRINGS.sub(" ", expr)
    text = _VARIABLES.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _TOKENS.finditer(text):
        name, call = match.group(1), match.group(2)
        if name and not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def contract_metrics() -> frozenset[str]:
    """The names in alerting-rules/metrics.txt (the metric contract)."""
    lines = CONTRACT_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def contract_sections() -> dict[str, list[str]]:
    """The names under each owner heading of metrics.txt (`# exporter ...`, `# remediator`):
    who serves each name."""
    sections: dict[str, list[str]] = {}
    owner = None
    for line in CONTRACT_FILE.read_text(encoding="utf-8").splitlines():
        if line.startswith(("# exporter", "# remediator")):
            owner = line[2:].split()[0]
        elif line.strip() and not line.startswith("#"):
            if owner is None:
                raise ValueError(f"{line!r} stands before any owner heading in {CONTRACT_FILE}")
            sections.setdefault(owner, []).append(line.strip())
    return sections


def unknown_metrics(names: set[str]) -> set[str]:
    """Names that are neither in the contract, nor a histogram series of one, nor built in."""
    allowed = contract_metrics() | BUILTIN_METRICS
    unknown = set()
    for name in names:
        base = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)
        if name not in allowed and base not in allowed:
            unknown.add(name)
    return unknown
