"""`mlx-medic remediate MODEL [--dry-run]`: the playbook by hand.

Same playbook, same model lock (so it never races the service or the serve
wrapper), same journal. Not held back by pause, budget or an open circuit: a
person decided. Exit status: 0 succeeded or planned (dry run), 1 any other end
(escalated, inconclusive, failed, interrupted), 2 usage or config error, 3 the model
lock is held.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from prometheus_client import CollectorRegistry

from mlx_medic.inventory import Inventory
from mlx_medic.remediator.cli_common import CliError, OnCall, add_config_argument, run_oncall
from mlx_medic.remediator.cli_log import RUN_HEADER, format_run
from mlx_medic.remediator.config import ConfigError
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.outcomes import RunOutcome
from mlx_medic.transport import SshTransport

EXIT_BY_OUTCOME: dict[str, int] = {
    RunOutcome.SUCCEEDED: 0, RunOutcome.PLANNED: 0, RunOutcome.LOCKED: 3,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("model", help="the model's name in the inventory")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan and journal every step, execute nothing")


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: remediate(oncall, args), writes=True)


def remediate(oncall: OnCall, args: argparse.Namespace) -> int:
    inventory = oncall.load_inventory()
    names = [m.name for m in inventory.models]
    if args.model not in names:
        raise oncall.unknown_model(args.model, names)
    try:
        return asyncio.run(_remediate(oncall, args, inventory))
    except KeyboardInterrupt:
        print("interrupted; the run is journaled as interrupted", file=sys.stderr)
        return 1


async def _remediate(oncall: OnCall, args: argparse.Namespace, inventory: Inventory) -> int:
    config, journal = oncall.config, oncall.journal
    transport = SshTransport(inventory)
    try:
        engine = Engine(config, inventory, journal, transport, registry=CollectorRegistry())
    except ConfigError as exc:
        await transport.close()
        raise CliError(f"config: {exc}") from exc
    try:
        run_id = await engine.run_manual(args.model, dry_run=args.dry_run or config.dry_run)
    finally:
        await engine.close()
        await transport.close()
    view = journal.get_run(run_id)
    assert view is not None
    print(RUN_HEADER)
    print("\n".join(format_run(view)))
    return EXIT_BY_OUTCOME.get(view.outcome, 1)
