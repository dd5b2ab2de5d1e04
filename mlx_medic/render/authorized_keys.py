"""`authorized-keys/NODE/authorized_keys`, for the node's login user: each key that logs in
there, pinned to the forced command with that key's table (mlx_medic.node.key_table) and
to the addresses it comes from, with no pty, forwarding or ~/.ssh/rc:

    restrict,no-user-rc,from="ADDRS",command="<medic_command> node forced-command
    --inventory <medic_config> --key remediator" ssh-ed25519 AAAA...

- the remediator's key on every node, `from=` the inventory's `ssh.remediator_addresses`
  (render refuses without them: a line without `from=` is a key usable from anywhere).
  The key: `--ssh.public-key FILE`, by default `ssh.identity_file` with `.pub` added.
- the serve wrapper's key (`--key serve`) on each node that is not the head of a model
  whose wrapper logs in with `serve.identity_file`, `from=` those models' heads (their
  `nodes.<name>.source_addresses`, by default their `ssh`). The key: `--serve.public-key
  FILE`, by default each model's `serve.identity_file` with `.pub`; models with different
  keys get a line each. A serve key that is the remediator's is refused: a key has one
  table (from an address both lines name, sshd would take the first line).
"""

from __future__ import annotations

import base64
import binascii
import shlex
import struct
from collections.abc import Mapping
from pathlib import PurePosixPath

from mlx_medic.inventory.schema import Inventory
from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site

TARGET = "authorized-keys"
RESTRICTIONS = ("restrict", "no-user-rc")  # restrict: no pty, no forwarding of any kind
ADDRESSES_FIELD = "ssh.remediator_addresses"


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


def forced_command(medic_command: str, medic_config: str, key: str) -> str:
    return shlex.join(
        [medic_command, "node", "forced-command", "--inventory", medic_config, "--key", key]
    )


def _quoted(text: str) -> str:
    """An option value as sshd reads it: in double quotes, `\\"` its only escape."""
    return '"' + text.replace('"', '\\"') + '"'


def key_options(command: str, addresses: list[str]) -> str:
    """A key line's options: the restrictions, `from=` and the forced command."""
    options = [*RESTRICTIONS, f"from={_quoted(','.join(addresses))}", f"command={_quoted(command)}"]
    return ",".join(options)


def key_line(command: str, addresses: list[str], key: str) -> str:
    return f"{key_options(command, addresses)} {key}"


def serve_keys(site: Site) -> dict[str, dict[str, list[str]]]:
    """node -> the serve wrapper's key line text -> the heads it comes from, for each node
    that is not the head of a model whose wrapper logs in with serve.identity_file."""
    return serve_key_heads(site.inventory, site.serve_public_keys)


def serve_key_heads(
    inventory: Inventory, keys: Mapping[str, str]
) -> dict[str, dict[str, list[str]]]:
    """node -> key -> the addresses of the heads that log in to it with that key, for
    `keys` (model -> its wrapper's key; models without one are left out)."""
    lines: dict[str, dict[str, list[str]]] = {}
    for model in inventory.models:
        key = keys.get(model.name)
        if key is None:
            continue
        head = inventory.node(model.head)
        for peer in model.nodes[1:]:
            heads = lines.setdefault(peer, {}).setdefault(key, [])
            heads += [a for a in head.source_addresses or [head.ssh] if a not in heads]
    return lines


def missing_in_inventory(inventory: Inventory) -> list[tuple[str, str]]:
    """(setting, why) for what this target needs from the inventory and it lacks."""
    if inventory.ssh.remediator_addresses:
        return []
    why = (
        "where the remediator's replicas log in from: a key line without from= could be"
        " used from anywhere"
    )
    return [(f"{ADDRESSES_FIELD} in the inventory", why)]


def render(site: Site) -> list[Rendered]:
    key = site.need(
        site.public_key,
        "--ssh.public-key (or the inventory's ssh.identity_file with its .pub beside it)",
    )
    if missing := missing_in_inventory(site.inventory):
        setting, why = missing[0]
        raise RenderError(f"needs {setting} ({why})")
    addresses = list(site.inventory.ssh.remediator_addresses)
    serve = serve_keys(site)
    if any(line.split()[1] == key.split()[1] for keys in serve.values() for line in keys):
        raise RenderError(
            "the serve wrapper's key is the remediator's; give each its own key"
            " (serve.identity_file, ssh.identity_file)"
        )
    files = []
    for node in site.inventory.nodes:
        medic = (services.medic_command(node), str(node.medic_config))
        text = (
            f"# {GENERATED}\n# Node {node.name}, for ~{node.user}/.ssh/authorized_keys: each key"
            " runs only what its user sends\n# (mlx-medic node forced-command --key;"
            " mlx_medic/node/key_table.py).\n# The remediator's key:\n"
            f"{key_line(forced_command(*medic, 'remediator'), addresses, key)}\n"
        )
        for serve_key, heads in serve.get(node.name, {}).items():
            text += (
                "# The serve wrapper's key, from the heads of the models this node is a"
                " peer of:\n"
                f"{key_line(forced_command(*medic, 'serve'), heads, serve_key)}\n"
            )
        files.append(Rendered(PurePosixPath(TARGET) / node.name / "authorized_keys", text, 0o600))
    return files
