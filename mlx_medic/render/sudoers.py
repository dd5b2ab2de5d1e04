"""sudoers.d files: on each head node, exactly the service-manager commands the
remediator runs there through `sudo -n`, for the user it logs in as, and nothing else;
on a node with `reboot.allowed`, the one reboot command the inventory names too.

The argument lists come from `service_manager.privileged_argv`, the one source the
commands themselves are built from. A rule's arguments are literal words (`,:=` escaped,
anything sudo would read as a pattern refused), so an extra or different word is refused.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mlx_medic.render.files import GENERATED, Rendered, RenderError, Site
from mlx_medic.service_manager import privileged_argv

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Node

TARGET = "sudoers"
FILE_NAME = "mlx-medic"  # sudo skips sudoers.d names with a '.' or ending in '~'
_WORD = re.compile(r"[A-Za-z0-9._/:+@=,~-]+")
_ESCAPED = re.compile(r"([,:=])")  # sudoers' own separators, written with a backslash


def escape(word: str, where: str) -> str:
    """One argument as a literal sudoers word; a word sudo would read as a pattern or
    split (spaces, wildcards, quotes) is refused, never guessed at."""
    if not _WORD.fullmatch(word):
        raise RenderError(f"{where}: {word!r} cannot be one literal word of a sudoers rule")
    return _ESCAPED.sub(r"\\\1", word)


def rule_commands(model: Model) -> list[str]:
    """The model's privileged commands as a rule writes them (and `sudo -l` lists them):
    sudoers words, escaped, one command per rule."""
    where = f"models.{model.name}.service"
    return [" ".join(escape(w, where) for w in argv) for argv in privileged_argv(model)]


def reboot_rule_command(node: Node) -> str | None:
    """The node's reboot command as its rule writes it; None unless `reboot.allowed`."""
    if not node.reboot.allowed:
        return None
    return " ".join(escape(w, f"nodes.{node.name}.reboot.command") for w in node.reboot.command)


def render(site: Site) -> list[Rendered]:
    files = []
    inventory = site.inventory
    for node in inventory.nodes:
        commands = [
            words
            for model in inventory.models
            if model.head == node.name
            for words in rule_commands(model)
        ]
        reboot = reboot_rule_command(node)
        if reboot is not None:
            commands.append(reboot)
        if not commands:
            continue
        rules = [f"{node.user} ALL=(root) NOPASSWD: {words}" for words in commands]
        allowed = "reboot.allowed: its reboot command, " if reboot is not None else ""
        comment = (
            f"{GENERATED}\n"
            f"Node {node.name}: the service-manager commands the remediator runs here as"
            f" {node.user}\n(sudo -n), {allowed}exactly these argument lists and nothing"
            " else. Install\nroot-owned 0440 as /etc/sudoers.d/mlx-medic; check with:"
            " visudo -cf FILE"
        )
        text = "".join(f"# {line}\n" for line in comment.splitlines()) + "\n".join(rules) + "\n"
        files.append(Rendered(PurePosixPath(TARGET) / node.name / FILE_NAME, text, 0o440))
    return files
