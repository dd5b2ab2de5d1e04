"""The layering the design card asks for, by subpackage of the one import name
`mlx_medic`: the exporter never imports the remediator, and the shared node knowledge
imports neither deployable (the CLI only dispatches, by module name)."""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mlx_medic"
DEPLOYABLES = ("exporter", "remediator")
FORBIDDEN = {
    "exporter": {"remediator"},
    "shared": {"exporter", "remediator"},
    "remediator": set(),
}


def module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def subpackage(module: str) -> str:
    """exporter, remediator or shared, for a module under `mlx_medic`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in DEPLOYABLES else "shared"


def imported_modules(path: Path, module: str) -> set[str]:
    """Absolute names of what a file imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found |= {f"{name}.{alias.name}" for alias in node.names}
    return found


def layer_violations(package_root: Path) -> dict[str, list[str]]:
    """file -> the imports that cross the layering the wrong way."""
    offenders: dict[str, list[str]] = {}
    files = [
        Path(d, f)
        for d, _, names in os.walk(package_root, followlinks=True)
        for f in names
        if f.endswith(".py")
    ]
    assert any("exporter" in path.parts for path in files)  # the links were followed
    for path in sorted(files):
        module = module_name(path, package_root)
        if module == f"{PACKAGE}.cli":
            continue
        forbidden = FORBIDDEN[subpackage(module)]
        bad = sorted(
            name
            for name in imported_modules(path, module)
            if name.split(".")[0] in DEPLOYABLES  # the old top-level names are gone
            or (name.startswith(f"{PACKAGE}.") and subpackage(name) in forbidden)
        )
        if bad:
            offenders[str(path.relative_to(package_root.parent))] = bad
    return offenders


def package_tree(tmp_path: Path) -> Path:
    """A real copy of the package (the links resolved), to plant imports in."""
    root = tmp_path / PACKAGE
    shutil.copytree(
        REPO / PACKAGE, root, symlinks=False, ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def test_the_exporter_never_imports_the_remediator_and_shared_code_imports_neither() -> None:
    assert layer_violations(REPO / PACKAGE) == {}


def test_the_deployables_are_subpackages_of_the_one_import_name() -> None:
    for name in DEPLOYABLES:
        assert (REPO / PACKAGE / name).resolve() == REPO / name
        assert (REPO / PACKAGE / name / "__init__.py").is_file()


def test_a_planted_import_of_the_remediator_from_the_exporter_is_caught(tmp_path: Path) -> None:
    root = package_tree(tmp_path)
    (root / "exporter" / "collectors" / "planted.py").write_text(
        "from mlx_medic.remediator.engine import Engine\n"
    )
    (root / "exporter" / "planted_relative.py").write_text("from ..remediator import journal\n")
    assert layer_violations(root) == {
        "mlx_medic/exporter/collectors/planted.py": [
            "mlx_medic.remediator.engine",
            "mlx_medic.remediator.engine.Engine",
        ],
        "mlx_medic/exporter/planted_relative.py": [
            "mlx_medic.remediator",
            "mlx_medic.remediator.journal",
        ],
    }


def test_shared_code_importing_a_deployable_or_an_old_top_level_name_is_caught(
    tmp_path: Path,
) -> None:
    root = package_tree(tmp_path)
    (root / "planted.py").write_text("import mlx_medic.exporter.main\nimport remediator\n")
    assert layer_violations(root) == {
        "mlx_medic/planted.py": ["mlx_medic.exporter.main", "remediator"]
    }


def test_the_packages_of_node_knowledge_import_nothing_at_their_top() -> None:
    """`mlx_medic.inventory`, `.processes` and `.state` only group modules: a node helper
    imports `inventory.snapshot` and `state.*` without pydantic, so no `__init__.py` may
    pull in a sibling (import each thing from the module that defines it)."""
    for name in ("inventory", "processes", "state"):
        path = REPO / PACKAGE / name / "__init__.py"
        assert imported_modules(path, f"{PACKAGE}.{name}") == set(), name
