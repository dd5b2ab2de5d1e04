"""Verbatim macOS tool outputs and a fake runner that answers with them.

Collectors that run platform tools take a `Runner`; these let their tests feed
the fixture files in tests/fixtures/macos/ (each starts with `#` lines naming
its source; the rest is the tool's output byte for byte) on any host.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlx_medic.platform.commands import CompletedCommand

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "macos"


def macos_output(name: str) -> str:
    """A fixture's tool output, without its `#` source header."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines and lines[0].startswith("#"), f"{name} must name its source in a # header"
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


class FakeRunner:
    """Answers each fixed argv with a prepared result (or raises), and records calls."""

    def __init__(self, answers: dict[tuple[str, ...], CompletedCommand | Exception]):
        self.answers = answers
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        argv = tuple(argv)
        self.calls.append((argv, timeout))
        answer = self.answers[argv]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(argv: tuple[str, ...], stdout: str) -> CompletedCommand:
    """What a tool that succeeded returns."""
    return CompletedCommand(argv=argv, returncode=0, stdout=stdout, stderr="")
