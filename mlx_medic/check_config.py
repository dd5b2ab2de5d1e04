"""`mlx-medic check-config FILE`: validate an inventory before anything uses it.

It loads the file exactly as the exporter and the remediator do (`load_inventory`, the
same models), so what it accepts they accept, and says which tmp/cache dirs several
models on a node share (`tmp_rules.scope_dirs`: weighed once, with the longest stale
age). `--schema` prints the field reference generated from those models
(docs/inventory.md holds the same table). A model whose JACCL is the testbed's simulation
(`serve.simulated_jaccl`) is refused unless `--allow-simulated-jaccl` says this is a
testbed: a real cluster must never believe a simulated backend.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlx_medic.inventory import Inventory, InventoryError, load_inventory
from mlx_medic.inventory_doc import human_duration
from mlx_medic.tmp_rules import ScopeDir, scope_dirs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("file", type=Path, nargs="?", help="inventory YAML")
    what.add_argument(
        "--schema", action="store_true",
        help="print every inventory field (path, type, default, meaning) and exit",
    )  # fmt: skip
    parser.add_argument(
        "--allow-simulated-jaccl", action="store_true",
        help="accept serve.simulated_jaccl (the testbed's simulated JACCL; never on a real"
        " cluster)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.schema:
        from mlx_medic.inventory_doc import reference

        print(reference())
        return 0
    try:
        inventory = load_inventory(args.file)
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    simulated = [m.name for m in inventory.models if m.serve.simulated_jaccl]
    if simulated and not args.allow_simulated_jaccl:
        print(f"{args.file}: models.{simulated[0]}.serve.simulated_jaccl: true: JACCL would be"
              " the testbed's simulation (testbed/README.md), which a real cluster must"
              " never run; remove it, or pass --allow-simulated-jaccl on a testbed"
              f" (models: {', '.join(simulated)})", file=sys.stderr)  # fmt: skip
        return 1
    print(
        f"{args.file}: ok: {len(inventory.nodes)} nodes, {len(inventory.models)} models"
        + "".join(f"\n  {m.name}: {' -> '.join(m.nodes)} port {m.port}" for m in inventory.models)
    )
    print("\n".join(shared_dirs_report(inventory)))
    return 0


def shared_dirs_report(inventory: Inventory) -> list[str]:
    """Which tmp/cache dirs several models on a node share, and the stale age they get."""
    nodes: dict[ScopeDir, list[str]] = {}
    for node in inventory.nodes:
        for scope in scope_dirs(inventory.models_on(node.name)):
            if scope.shared:
                nodes.setdefault(scope, []).append(node.name)
    if not nodes:
        return ["shared dirs: none"]
    lines = ["shared dirs (weighed once; an entry is stale only when no process uses it and it"
             " is older than every sharing model's stale_tmp_age):"]
    for scope, where in nodes.items():
        lines.append(f"  {scope.path} on {', '.join(where)}: {', '.join(scope.models)}"
                     f" (stale after {human_duration(scope.stale_age)})")
    return lines
