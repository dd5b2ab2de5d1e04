"""Where `supervisorctl -c CONFIG` would connect: the unix socket its `[supervisorctl]`
section names, read as supervisorctl reads it. The service helper asks supervisord there
directly (mlx_medic.platform.supervisord_rpc); a config this reader does not follow (an
http server, no `[supervisorctl]` section, an expansion it cannot make) names no socket, and
supervisorctl runs as before and says what is wrong.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SupervisorSocket:
    """Where supervisorctl -c CONFIG would connect, and as whom."""

    path: Path
    username: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.path}"


def socket_of(config: Path) -> SupervisorSocket | None:
    """The unix socket the config's `[supervisorctl]` section names, read as supervisorctl
    reads it (`;`/`#` comments, `%(here)s` and `%(ENV_X)s`); None where it names none."""
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"), strict=False)
    try:
        with config.open(encoding="utf-8") as file:
            parser.read_file(file)
    except (OSError, UnicodeDecodeError, configparser.Error):
        return None
    if not parser.has_section("supervisorctl"):
        return None
    here = os.path.dirname(os.path.abspath(config))
    expansions = {f"ENV_{key}": value for key, value in os.environ.items()} | {"here": here}
    section = parser["supervisorctl"]
    try:
        serverurl = section.get("serverurl", "http://localhost:9001") % expansions
        username = section.get("username")
        password = section.get("password")
        username = username % expansions if username is not None else None
        password = password % expansions if password is not None else None
    except (KeyError, ValueError, TypeError):
        return None
    if not serverurl.startswith("unix://"):
        return None
    path = Path(os.path.normpath(os.path.abspath(os.path.expanduser(serverurl[len("unix://") :]))))
    return SupervisorSocket(path, username, password)
