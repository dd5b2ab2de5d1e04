"""The layering the design card asks for: the exporter never imports the remediator,
and the shared node knowledge imports neither deployable (the CLI only dispatches)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("exporter", {"remediator"}), ("mlx_medic", {"remediator", "exporter"})],
)
def test_a_package_never_imports_what_it_must_not_know(package: str, forbidden: set[str]) -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(imported_packages(path) & forbidden)
        for path in (REPO / package).rglob("*.py")
        if path.name != "cli.py" and imported_packages(path) & forbidden
    }
    assert offenders == {}
