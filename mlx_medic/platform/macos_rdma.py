"""Parsers for the macOS RDMA-over-Thunderbolt tools: `ibv_devinfo` and `ioclasscount`.

Tested on verbatim outputs in tests/fixtures/macos/ (Apple TN3205, a capture
from two M5 Max MacBook Pros, the ioclasscount(8) man page). JACCL needs every
`rdma_enX` port PORT_ACTIVE, and the kernel's live count of protection domains
and queue pairs (a budget of 11 per device) is the only early sign of the leak
that ends in `[jaccl] Couldn't allocate protection domain`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlx_medic.platform.commands import CommandError, CommandNotFound, ParseError, Runner, excerpt

IBV_DEVINFO_ARGV = ("ibv_devinfo",)
PROTECTION_DOMAIN_CLASS = "AppleThunderboltRDMAProtectionDomain"
QUEUE_PAIR_CLASS = "AppleThunderboltRDMAQueuePair"
# metric label `kind` -> IOKit class counted by ioclasscount
RDMA_OBJECT_CLASSES = {
    "protection_domain": PROTECTION_DOMAIN_CLASS,
    "queue_pair": QUEUE_PAIR_CLASS,
}
IOCLASSCOUNT_ARGV = ("ioclasscount", PROTECTION_DOMAIN_CLASS, QUEUE_PAIR_CLASS)
IOCLASSCOUNT_ALL_ARGV = ("ioclasscount",)  # every class, one a line

# rdma-core prints this (and exits non-zero) when there is no device at all.
_NO_DEVICES = re.compile(r"^\s*No IB devices found\s*$", re.MULTILINE)
_KEY_VALUE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s*(.*?)\s*$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_PORT_STATE = re.compile(r"^(PORT_[A-Z_]+)(?:\s*\(\d+\))?$")


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str  # e.g. PORT_ACTIVE, PORT_DOWN

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"


def no_devices(text: str) -> bool:
    """True when ibv_devinfo says there are no RDMA devices (RDMA off or absent)."""
    return bool(_NO_DEVICES.search(text))


def rdma_tool_output(runner: Runner, argv: tuple[str, ...], timeout: float) -> str | None:
    """The tool's output; None when it is not installed (no RDMA here: absent, never zero).
    A tool that is there but fails raises CommandError: a broken probe is not "no RDMA"."""
    try:
        result = runner(argv, timeout)
    except CommandNotFound:
        return None
    if result.returncode == 0:
        return result.stdout
    said = result.stdout + result.stderr
    if argv == IBV_DEVINFO_ARGV and no_devices(said):
        return said  # rdma-core's "No IB devices found" exits non-zero: no ports
    first = said.strip().splitlines()[0][:200] if said.strip() else "no output"
    raise CommandError(f"`{' '.join(argv)}` exited with status {result.returncode}: {first}")


def parse_ibv_devinfo(text: str) -> list[RdmaPort]:
    """Every (device, port, state) in `ibv_devinfo` output, in order.

    Reads only `hca_id:`, `port:` and `state:` lines, so Apple's `...`
    elisions, `-v` extras and new fields do not matter. Raises ParseError on
    output that is not ibv_devinfo's (no `hca_id:` line, a state outside a port).
    """
    if no_devices(text):
        return []
    ports: list[RdmaPort] = []
    device: str | None = None
    port: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _KEY_VALUE.match(line)
        if not match:
            continue
        key, value = match.groups()
        if key == "hca_id":
            if not _DEVICE_NAME.match(value):
                raise ParseError(f"ibv_devinfo line {number}: {value!r} is not a device name")
            device, port = value, None
        elif key == "port" and device is not None:
            if not value.isdigit():
                raise ParseError(f"ibv_devinfo line {number}: port {value!r} is not a number")
            port = int(value)
        elif key == "state" and device is not None:
            state = _PORT_STATE.match(value)
            if port is None or state is None:
                raise ParseError(
                    f"ibv_devinfo line {number}: state {value!r} outside a port of {device}"
                )
            ports.append(RdmaPort(device, port, state.group(1)))
    if device is None:
        raise ParseError(f"ibv_devinfo printed no `hca_id:` line (it printed {excerpt(text)})")
    return ports


_COUNT_ENTRY = re.compile(
    r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*) = "
    r"(?P<value>\d+|<no such class>|\?\? \(error reading/converting value\))$"
)


def parse_ioclasscount(text: str) -> dict[str, int | None]:
    """`ClassName = N` entries -> {class: N}; a class the kernel does not know -> None.

    ioclasscount prints the classes asked for as one comma-separated line
    (`IOPCIDevice = 2, AppleTestPCI = 1`), or one per line when asked for all.
    `<no such class>` means the driver is not loaded: the caller reports
    nothing rather than a zero.
    """
    counts: dict[str, int | None] = {}
    for line in text.splitlines():
        for entry in filter(None, (part.strip() for part in line.split(", "))):
            match = _COUNT_ENTRY.match(entry)
            if not match:
                raise ParseError(f"ioclasscount printed {entry[:80]!r}, not `ClassName = N`")
            value = match.group("value")
            if value.startswith("??"):
                raise ParseError(f"ioclasscount could not read the count of {match['name']}")
            counts[match["name"]] = int(value) if value.isdigit() else None
    if not counts:
        raise ParseError(f"ioclasscount printed no counts (it printed {excerpt(text)})")
    return counts


def rdma_object_counts(text: str) -> dict[str, int]:
    """{kind: count} from `ioclasscount` output for IOCLASSCOUNT_ARGV.

    A class reported as `<no such class>` is left out (not zero); a class
    missing from the output altogether is a ParseError.
    """
    counts = parse_ioclasscount(text)
    found: dict[str, int] = {}
    for kind, class_name in RDMA_OBJECT_CLASSES.items():
        if class_name not in counts:
            raise ParseError(f"ioclasscount did not report {class_name}")
        value = counts[class_name]
        if value is not None:
            found[kind] = value
    return found
