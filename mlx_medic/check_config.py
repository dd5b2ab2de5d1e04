"""`mlx-medic check-config FILE`: validate an inventory before anything uses it.

It loads the file exactly as the exporter and the remediator do (`load_inventory`, the
same models), so what it accepts they accept. `--schema` prints the field reference
generated from those models (docs/inventory.md holds the same table).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlx_medic.inventory import InventoryError, load_inventory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("file", type=Path, nargs="?", help="inventory YAML")
    what.add_argument(
        "--schema", action="store_true",
        help="print every inventory field (path, type, default, meaning) and exit",
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
    print(
        f"{args.file}: ok: {len(inventory.nodes)} nodes, {len(inventory.models)} models"
        + "".join(f"\n  {m.name}: {' -> '.join(m.nodes)} port {m.port}" for m in inventory.models)
    )
    return 0
