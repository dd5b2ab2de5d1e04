"""The inventory's field types, shared by its sections: names, user names, durations,
absolute paths, SSH sources, and the strict base every section derives from.

Each parser rides on its type (`Duration`, `AbsolutePath`, `SshSource`), so every field
of that type accepts the same spellings and the reference (`mlx_medic.inventory.reference`)
can name the type.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from mlx_medic.inventory.names import NAME_PATTERN

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
USER_NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
DEFAULT_LOGIN_USER = "mlx-medic"  # a named user of its own, never root by default

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from `90`, `90s`, `15m`, `2h` or `1d`."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ValueError(f"{value!r} is not a duration; use seconds or e.g. '90s', '15m', '2h'")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


# Seconds; the file may say `90`, `90s`, `15m`, `2h` or `1d`. The parser rides on the type,
# so every duration field accepts the same spellings and the reference can name the type.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


def _absolute_path(value: Path) -> Path:
    if not value.is_absolute() or ".." in value.parts:
        raise ValueError(f"{str(value)!r} must be an absolute path without '..'")
    return value


# A file the inventory names on a node (its own copy, a plist, an interpreter, a key).
AbsolutePath = Annotated[Path, AfterValidator(_absolute_path)]


class StrictModel(BaseModel):
    """A config section that refuses unknown keys (a typo is an error, never ignored) and
    never changes once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def _ssh_source(value: str) -> str:
    """An address sshd's `from=` matches: an IP, a network (CIDR) or a host name."""
    try:
        return str(
            ipaddress.ip_network(value, strict=True)
            if "/" in value
            else ipaddress.ip_address(value)
        )
    except ValueError as exc:
        if "/" in value or re.fullmatch(r"[0-9.]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*", value):
            raise ValueError(f"{value!r} is not an IP address or network: {exc}") from None
    if not _HOST_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an IP address, a network (CIDR) or a host name (no wildcards)"
        )
    return value


SshSource = Annotated[str, AfterValidator(_ssh_source)]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"
