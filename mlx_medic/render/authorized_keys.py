"""The remediator's key in each node's `authorized_keys`, pinned to the node helpers:
sshd runs `<medic_command> node forced-command --config.file <medic_config>` for every
login with it (the command checks SSH_ORIGINAL_COMMAND), with no pty and no forwarding.

The key is the remediator's public key: `--ssh.public-key FILE`, by default the
inventory's `ssh.identity_file` with `.pub` added (what ssh-keygen writes beside it).
"""

from __future__ import annotations

import base64
import binascii
import shlex
import struct
from pathlib import PurePosixPath

from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site

TARGET = "authorized-keys"
RESTRICTIONS = ("no-pty", "no-port-forwarding", "no-agent-forwarding", "no-X11-forwarding")


def check_public_key(line: str, source: str) -> str:
    """`TYPE BASE64 [COMMENT]` whose blob names the same TYPE; else a RenderError."""
    words = line.strip().split(None, 2)
    if len(words) < 2 or "\n" in line.strip():
        raise RenderError(f"{source}: not one public key line (TYPE BASE64 [COMMENT])")
    try:
        blob = base64.b64decode(words[1], validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        kind = blob[4 : 4 + length].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError) as exc:
        raise RenderError(f"{source}: the key is not valid base64 key data ({exc})") from None
    if kind != words[0]:
        raise RenderError(f"{source}: the key says {words[0]!r} but its data is {kind!r}")
    return " ".join(words)


def forced_command(medic_command: str, medic_config: str) -> str:
    return shlex.join([medic_command, "node", "forced-command", "--config.file", medic_config])


def key_line(command: str, key: str) -> str:
    quoted = command.replace("\\", "\\\\").replace('"', '\\"')
    return ",".join([f'command="{quoted}"', *RESTRICTIONS]) + f" {key}"


def render(site: Site) -> list[Rendered]:
    key = site.need(site.public_key, "--ssh.public-key (or the inventory's ssh.identity_file"
                    " with its .pub beside it)", TARGET)
    files = []
    for node in site.inventory.nodes:
        command = forced_command(services.medic_command(node), str(node.medic_config))
        text = (
            f"# {GENERATED}\n# Node {node.name}: the remediator's key, for ~{node.user}/.ssh/"
            "authorized_keys;\n# it runs only the node helpers, the model lock's among them.\n"
            f"{key_line(command, key)}\n"
        )
        files.append(Rendered(PurePosixPath(TARGET) / node.name / "authorized_keys", text,
                              0o600))
    return files
