"""`mlx-medic journal prune`: bound the service's journal now, as the service does at
start and every `journal_retention.interval` (remediator/journal/retention.py says what
goes and what never does). `--dry-run` says what a prune would delete and deletes nothing.

The budget windows of the inventory's models are kept, so the inventory must be readable.

Exit status: 0 pruned (or nothing to prune, or the dry run said what it would); 2 nothing
deleted: no config to tell the service's journal, inventory unreadable, journal not
writable or failing.
"""

from __future__ import annotations

import argparse

from mlx_medic.remediator.cli_common import OnCall, add_config_argument, run_oncall
from mlx_medic.remediator.journal.retention import prune


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["prune"],
        metavar="ACTION",
        help="prune: delete now what journal_retention in the config lets go",
    )
    add_config_argument(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="say what a prune would delete; delete nothing"
    )


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: prune_journal(oncall, args.dry_run), writes=True)


def prune_journal(oncall: OnCall, dry_run: bool) -> int:
    windows = [m.policy.window for m in oncall.load_inventory().models]
    retention = oncall.config.journal_retention
    oncall.journal.flush()
    result = prune(oncall.config.journal, retention.bounds(windows), dry_run=dry_run)
    print(f"journal {oncall.config.journal}: {result.summary()}")
    return 0
