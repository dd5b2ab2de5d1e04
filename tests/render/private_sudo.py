"""A rendered sudoers file checked by the real sudo, in a private mount namespace.

Run by `in_private_etc(..., module="tests.render.private_sudo")`: /etc and /var/lib are
the private overlays of tests/remediator/private_etc.py; /usr/bin gets one too, where the
service manager's binary the rules name is a stub (this is Linux: no /bin/launchctl), so
sudo can resolve the command. The file is installed as /etc/sudoers.d/mlx-medic, root
0440, its user added to the private /etc/passwd, and each command asked of
`sudo -n -l COMMAND` as that user: exit 0 allowed, else refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.remediator.private_etc import _mount_overlays, _overlay, add_user


def check(
    scratch: Path, sudoers: Path, user: str, stubs: list[str], commands: list[list[str]]
) -> dict[str, Any]:
    _overlay(Path("/usr/bin"), scratch)
    for stub in stubs:
        path = Path(os.path.realpath(stub))
        if not path.exists():
            path.write_text("#!/bin/sh\nexit 0\n")
            path.chmod(0o755)
    installed = Path("/etc/sudoers.d/mlx-medic")
    installed.write_bytes(sudoers.read_bytes())
    os.chown(installed, 0, 0)
    installed.chmod(0o440)
    account = add_user(user, Path("/nonexistent"))
    with open("/etc/shadow", "a") as shadow:  # PAM's account check wants an entry, no password
        shadow.write(f"{user}:*:19000:0:99999:7:::\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C"}

    def sudo(*argv: str) -> dict[str, Any]:
        result = subprocess.run(
            ["sudo", "-n", "-l", *argv],
            env=env,
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return {
            "argv": list(argv),
            "code": result.returncode,
            "out": result.stdout,
            "err": result.stderr,
        }

    return {"listing": sudo(), "commands": [sudo(*argv) for argv in commands]}


def main(scenario: str, scratch: str, spec: str) -> None:
    _mount_overlays(Path(scratch))
    if scenario != "check":
        raise SystemExit(f"unknown scenario {scenario!r}")
    data = json.loads(Path(spec).read_text())
    print(
        json.dumps(
            check(
                Path(scratch), Path(data["sudoers"]), data["user"], data["stubs"], data["commands"]
            )
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
