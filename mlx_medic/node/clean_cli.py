"""`mlx-medic node clean MODEL [--dry-run]`: remove the model's stale tmp entries and
mlx.launch's leftovers of dead launches on this node (see mlx_medic.node.clean); reports
bytes freed. Exit 0 when done (an entry that changed since it was judged is skipped, not
an error; another user's entry this user may not remove or read is in `not_ours` with its
owner, left whole, not an error either), 1 when a removal failed, 2 for bad arguments."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mlx_medic.node.cli import (
    EXIT_FAILED,
    EXIT_OK,
    add_node_arguments,
    emit,
    node_context,
)
from mlx_medic.node.model_arg import placed_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the inventory model to clean up after")
    parser.add_argument(
        "--dry-run", action="store_true", help="report what would be removed; remove nothing"
    )
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node.clean import Cleaner
    from mlx_medic.platform.temp_dirs import user_temp_dirs
    from mlx_medic.tmp_rules import scope_dirs

    context = node_context(args)
    model = placed_model(context, args.model)
    inventory = context.inventory
    assert inventory is not None  # placed_model requires one
    launch_dirs = list(inventory.launch_temp_dirs) or user_temp_dirs([model.service.user])
    report = Cleaner(
        model=model,
        node=context.node,
        dirs=scope_dirs(inventory.models_on(context.node)),
        launch_dirs=launch_dirs,
        dry_run=args.dry_run,
        clock=time.time,
    ).run()
    document = report.to_json()
    verb = "would remove" if args.dry_run else "removed"
    lines = [
        f"clean of {model.name} on {context.node}: {verb} {len(document['removed'])}"
        f" entr{'y' if len(document['removed']) == 1 else 'ies'},"
        f" {document['bytes_freed']} bytes"
    ]
    lines += [f"  {verb} {r['kind']} {r['path']} ({r['bytes']} bytes)" for r in document["removed"]]
    lines += [f"  skipped {s['path']}: {s['reason']}" for s in document["skipped"]]
    lines += [f"  {not_ours_words(entry)}" for entry in document["not_ours"]]
    emit("clean", document, args.json, "\n".join(lines))
    for entry in document["not_ours"]:
        print(f"mlx-medic node clean: {not_ours_words(entry)}", file=sys.stderr)
    if report.failed:
        print(
            f"mlx-medic node clean: {report.failed} removal(s) failed on node {context.node}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def not_ours_words(entry: dict[str, Any]) -> str:
    """`not ours: stale_dir /tmp/tmp.x is root's: may not remove it: ...; left whole`."""
    return f"not ours: {entry['kind']} {entry['path']} is {entry['owner']}'s: {entry['why']}"
