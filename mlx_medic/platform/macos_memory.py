"""Parsers for macOS memory tools: `sysctl kern.memorystatus_vm_pressure_level`, `vm_stat`.

A JACCL error on one Mac can be caused by another Mac running out of memory,
so each node reports the kernel's own pressure level (what Activity Monitor
colours its graph with) and its wired memory (Metal-wired model weights count
there). Tested on verbatim outputs in tests/fixtures/macos/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlx_medic.platform.commands import ParseError, excerpt

PRESSURE_SYSCTL = "kern.memorystatus_vm_pressure_level"
PRESSURE_ARGV = ("sysctl", PRESSURE_SYSCTL)
VM_STAT_ARGV = ("vm_stat",)

# DISPATCH_MEMORYPRESSURE_NORMAL / _WARN / _CRITICAL, the only values the kernel reports.
PRESSURE_LEVELS = {1: "normal", 2: "warn", 4: "critical"}

_PRESSURE_LINE = re.compile(rf"^{re.escape(PRESSURE_SYSCTL)}: (\S+)$")
_VM_STAT_HEADER = re.compile(r"^Mach Virtual Memory Statistics: \(page size of (\d+) bytes\)$")
_VM_STAT_LINE = re.compile(r"^(?P<label>[^:]+):\s+(?P<value>\d+)\.$")


def parse_pressure_level(text: str) -> int:
    """1 (normal), 2 (warn) or 4 (critical) from `sysctl kern.memorystatus_vm_pressure_level`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _PRESSURE_LINE.match(lines[0]) if len(lines) == 1 else None
    if match is None:
        raise ParseError(f"sysctl printed {excerpt(text)}, not `{PRESSURE_SYSCTL}: N`")
    value = match.group(1)
    if not value.isdigit() or int(value) not in PRESSURE_LEVELS:
        raise ParseError(f"{PRESSURE_SYSCTL} is {value!r}; known levels are 1, 2 and 4")
    return int(value)


@dataclass(frozen=True)
class VmStat:
    page_size: int
    pages: dict[str, int]  # label as printed, e.g. "Pages wired down"

    def bytes_of(self, label: str) -> int | None:
        pages = self.pages.get(label)
        return None if pages is None else pages * self.page_size

    @property
    def wired_bytes(self) -> int | None:
        return self.bytes_of("Pages wired down")

    @property
    def compressor_bytes(self) -> int | None:
        return self.bytes_of("Pages occupied by compressor")


def parse_vm_stat(text: str) -> VmStat:
    """Page size from the header and every `Label: N.` counter, looked up by label.

    Newer macOS builds add lines, and very old ones print an `Object cache:`
    sentence; lines that are not counters are skipped. A missing header means
    this is not vm_stat output.
    """
    lines = text.splitlines()
    header = _VM_STAT_HEADER.match(lines[0].strip()) if lines else None
    if header is None:
        raise ParseError(f"vm_stat printed {excerpt(text)}, not its `Mach Virtual Memory` header")
    page_size = int(header.group(1))
    if page_size <= 0 or page_size & (page_size - 1):
        raise ParseError(f"vm_stat page size {page_size} is not a power of two")
    pages: dict[str, int] = {}
    for line in lines[1:]:
        match = _VM_STAT_LINE.match(line.strip())
        if match:
            pages[match["label"]] = int(match["value"])
    if not pages:
        raise ParseError("vm_stat printed its header but no counters")
    return VmStat(page_size=page_size, pages=pages)


WIRED_LIMIT_SYSCTL = "iogpu.wired_limit_mb"
WIRED_LIMIT_ARGV = ("sysctl", WIRED_LIMIT_SYSCTL)
_WIRED_LIMIT_LINE = re.compile(rf"^{re.escape(WIRED_LIMIT_SYSCTL)}: (\d+)$")


def parse_wired_limit_bytes(text: str) -> int | None:
    """The GPU's wired-memory cap from `sysctl iogpu.wired_limit_mb`, in bytes; None for 0,
    macOS's default policy (no cap an operator set; the mlx-lm README's `sudo sysctl
    iogpu.wired_limit_mb=N` sets one, lost at reboot)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _WIRED_LIMIT_LINE.match(lines[0]) if len(lines) == 1 else None
    if match is None:
        raise ParseError(f"sysctl printed {excerpt(text)}, not `{WIRED_LIMIT_SYSCTL}: N`")
    megabytes = int(match.group(1))
    return megabytes * 1024 * 1024 if megabytes else None
