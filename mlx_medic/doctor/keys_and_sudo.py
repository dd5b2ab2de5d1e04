"""Readers for what a node's setup holds: the login user's `authorized_keys` lines and
the rules `sudo -l` lists for it.

`sudo -l` prints, after its `Defaults` section, `User NAME may run the following commands
on HOST:` and one line per rule, `(RUNAS) TAG: COMMAND`, the command written as the rule
writes it (sudoers escapes included); tested on verbatim listings of Debian's sudo
1.9.13p3 in tests/fixtures/sudo/. An `authorized_keys` line is sshd's: options, then the
key; an option's value is in double quotes, `\\"` its one escape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlx_medic.platform.commands import ParseError, excerpt

_MAY_RUN = re.compile(r"^User \S+ may run the following commands on \S+:$")
_RULE = re.compile(r"^\((?P<runas>[^)]*)\)\s+(?P<rest>.*)$")
_TAG = re.compile(r"^([A-Z_]+):\s*")
_COMMANDS = re.compile(r"(?<!\\), ")  # one rule may list several commands
KEY_TYPES = ("ssh-", "ecdsa-", "sk-")  # a line that starts with its key has no options


@dataclass(frozen=True)
class SudoRule:
    runas: str  # e.g. root, ALL : ALL
    tags: tuple[str, ...]  # e.g. NOPASSWD
    command: str  # as sudoers writes it


def parse_sudo_listing(text: str) -> list[SudoRule]:
    """Every command of `sudo -l`'s listing, with its run-as user and tags; ParseError
    when the text holds no `User ... may run the following commands on ...:` line."""
    lines = [line.strip() for line in text.splitlines()]
    start = next((n for n, line in enumerate(lines) if _MAY_RUN.match(line)), None)
    if start is None:
        raise ParseError(f"sudo -l printed {excerpt(text)}, not a list of commands")
    rules = []
    for line in lines[start + 1 :]:
        rule = _RULE.match(line)
        if rule is None:
            continue
        rest, tags = rule["rest"], []
        while tag := _TAG.match(rest):
            tags.append(tag[1])
            rest = rest[tag.end() :]
        rules += [SudoRule(rule["runas"], tuple(tags), c.strip()) for c in _COMMANDS.split(rest)]
    return rules


@dataclass(frozen=True)
class KeyOptions:
    text: str  # the options as written, "" for a key without any
    options: dict[str, str | None]  # name -> value (None: a flag such as `restrict`)

    @property
    def command(self) -> str | None:
        return self.options.get("command")

    @property
    def addresses(self) -> list[str]:
        value = self.options.get("from")
        return value.split(",") if value else []


def _split_unquoted(text: str, separators: str) -> tuple[list[str], int]:
    """`text` split at `separators` outside double quotes, up to its first unquoted
    blank; and where that blank is."""
    parts, start, quoted, at = [], 0, False, 0
    while at < len(text):
        char = text[at]
        if quoted and char == "\\":
            at += 2
            continue
        if char == '"':
            quoted = not quoted
        elif not quoted and char in " \t":
            break
        elif not quoted and char in separators:
            parts.append(text[start:at])
            start = at + 1
        at += 1
    parts.append(text[start:at])
    return parts, at


def parse_key_options(line: str) -> KeyOptions:
    """The options of one `authorized_keys` line."""
    line = line.strip()
    if line.startswith(KEY_TYPES):
        return KeyOptions("", {})
    parts, end = _split_unquoted(line, ",")
    options: dict[str, str | None] = {}
    for part in parts:
        name, sep, value = part.partition("=")
        if sep and len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"')
        options[name.lower()] = value if sep else None
    return KeyOptions(line[:end], options)
