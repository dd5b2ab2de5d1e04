"""A config file that cannot be used, and every reason why, with each one's place.

The inventory (`InventoryError`) and the remediator's config (`ConfigFileError`) raise
it alike, so a person reads both the same way and a command can tell a file it could not
read (`unreadable`: a usage error) from one it read and found wrong. Nothing here imports
pydantic or PyYAML: a node helper's light inventory path raises it too.
"""

from __future__ import annotations


class FileProblems(ValueError):
    """`source` cannot be used; `problems` lists each one, with its line where it has one.

    `unreadable`: the file could not be read at all (missing, a directory, no permission),
    so nothing is known about its content. `headline`: what explains them all, said after
    the file's name before the problems (the other kind of config file was given).
    """

    def __init__(
        self,
        source: str,
        problems: list[str],
        *,
        unreadable: bool = False,
        headline: str | None = None,
    ):
        self.source = source
        self.problems = problems
        self.unreadable = unreadable
        self.headline = headline
        super().__init__(
            f"{source} {headline}" if headline else f"{source}: " + "; ".join(problems)
        )

    def said(self) -> str:
        """What a command prints: one line when one line says it all (an unreadable file,
        or one problem and no headline), else the report."""
        if self.unreadable or (len(self.problems) == 1 and not self.headline):
            return str(self)
        return self.report()

    def report(self) -> str:
        """The headline, then the file's name and count, then a problem a line; one line
        for a file that could not be read."""
        if self.unreadable:
            return str(self)
        lines = [f"{self.source} {self.headline}"] if self.headline else []
        lines.append(f"{self.source}: {len(self.problems)} problem(s)")
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)
