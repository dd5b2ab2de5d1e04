"""No import circle in `mlx_medic`: the process model is a leaf the platform tables
build on, and no module needs itself to be imported first (imports inside functions
count: they only hide a circle until the function runs)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.test_layering import PACKAGE, REPO, imported_modules, module_name, package_tree


def import_graph(package_root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file)."""
    files = {
        module_name(Path(d, f), package_root): Path(d, f)
        for d, _, names in os.walk(package_root, followlinks=True)
        for f in names
        if f.endswith(".py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        found = set()
        for name in imported_modules(path, module):
            while name and name not in files:  # `from pkg.mod import Name` -> pkg.mod
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
        graph[module] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


# The process model: what a process is, what its command line runs, its role, its scope.
PROCESS_MODEL = (
    "mlx_medic.processes.info",
    "mlx_medic.processes.command_line",
    "mlx_medic.processes.roles",
    "mlx_medic.processes.scope",
)


def test_the_process_model_imports_no_platform_module() -> None:
    for module in PROCESS_MODEL:
        path = REPO / (module.replace(".", "/") + ".py")
        imported = imported_modules(path, module)
        assert sorted(n for n in imported if n.startswith(f"{PACKAGE}.platform")) == [], module


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    assert circles(import_graph(REPO / PACKAGE)) == []


def test_a_planted_circle_is_caught(tmp_path: Path) -> None:
    root = package_tree(tmp_path)
    with (root.parent / "mlx_medic/processes/info.py").open("a") as model:
        model.write(
            "\n\ndef _planted():\n    from mlx_medic.platform.proc_linux import parse_stat\n"
        )
    planted = {"mlx_medic.processes.info", f"{PACKAGE}.platform.proc_linux"}
    assert any(planted <= set(group) for group in circles(import_graph(root)))
