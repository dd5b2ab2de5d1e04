"""docs/node-helpers.md lists every helper in HELPERS, with its own section, as the
inventory reference lists every field: a helper added without its documentation fails."""

from __future__ import annotations

import re
from pathlib import Path

from mlx_medic.node.cli import HELPERS

DOC = Path(__file__).resolve().parents[2] / "docs" / "node-helpers.md"


def sections() -> list[str]:
    return re.findall(r"^## `([a-z-]+)`$", DOC.read_text(encoding="utf-8"), re.MULTILINE)


def test_every_helper_has_a_section_in_the_node_helpers_reference() -> None:
    assert sorted(HELPERS) == sorted(set(sections())), "document each helper in the reference"


def test_each_helper_is_documented_once_so_no_two_sections_can_disagree() -> None:
    twice = sorted({name for name in sections() if sections().count(name) > 1})
    assert not twice, f"docs/node-helpers.md documents these helpers more than once: {twice}"


def test_the_reference_names_each_helpers_json_and_exit_status() -> None:
    text = DOC.read_text(encoding="utf-8")
    for helper in HELPERS:
        section = text.split(f"## `{helper}`", 1)[1].split("\n## ", 1)[0]
        assert "Exit" in section, helper
        assert "JSON" in section or helper == "forced-command", helper
