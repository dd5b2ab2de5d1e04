"""Parser for `launchctl print system/LABEL`: what launchd holds for a loaded job.

`mlx-medic doctor` reads it to see that a model's job is loaded where the playbooks'
`launchctl bootout system/LABEL` and `bootstrap system PLIST` expect: from the plist the
inventory names, as the service's user, running what `mlx-medic render launchd` writes.
Tested on a verbatim published output in tests/fixtures/macos/ (Sumo Logic's docs).

The output is a `TARGET = {` block of `key = value` lines, with nested `key = {` blocks
(arguments, environment, ...); only the job's own top-level keys and its `arguments`
are read, so new keys and lines that are not `key = value` do not matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_medic.platform.commands import ParseError, excerpt


@dataclass(frozen=True)
class LaunchdJob:
    target: str  # e.g. system/com.example.job
    fields: dict[str, str]  # top-level `key = value`, as printed
    arguments: tuple[str, ...]  # the `arguments = {` block, one argument a line

    @property
    def path(self) -> str | None:
        """The plist it was loaded from."""
        return self.fields.get("path")

    @property
    def username(self) -> str | None:
        return self.fields.get("username")

    @property
    def state(self) -> str | None:
        return self.fields.get("state")


def parse_launchctl_print(text: str, target: str) -> LaunchdJob:
    """The job's top-level fields and arguments; ParseError when the text is not
    `launchctl print TARGET` output (no `TARGET = {` first line, unbalanced braces)."""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines or lines[0] != f"{target} = {{":
        raise ParseError(f"launchctl print printed {excerpt(text)}, not `{target} = {{`")
    fields: dict[str, str] = {}
    arguments: list[str] = []
    blocks: list[str] = []  # the open nested blocks' keys, innermost last
    for line in lines[1:]:
        if line == "}":
            if not blocks:
                break  # the job's own block closes
            blocks.pop()
            continue
        key, sep, value = line.partition(" = ")
        if line.endswith(" = {"):
            blocks.append(line[: -len(" = {")])
        elif blocks == ["arguments"]:
            arguments.append(line)
        elif not blocks and sep:
            fields.setdefault(key, value)
    else:
        raise ParseError(f"launchctl print's block of {target} never closes")
    return LaunchdJob(target, fields, tuple(arguments))
