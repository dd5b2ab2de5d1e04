"""`mlx-medic check-config FILE`: validate an inventory before anything uses it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlx_medic.inventory import InventoryError, load_inventory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="inventory YAML")


def run(args: argparse.Namespace) -> int:
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
