"""`mlx-medic remediate MODEL [--dry-run] [--force]`: the playbook by hand.

Same playbook, same model lock (so it never races the service or the serve
wrapper), same journal; a dry run takes no lock and asks no node (it journals the
plan). Not held back by budget or an open circuit (the robot gave up; a person
decided). A pause is different: a person said hands off, so a paused model (or all
models paused) is refused unless `--force`, and the journal records the override
with who gave it. Exit status: 0 succeeded or planned (dry run), 1 any other end
(escalated, inconclusive, failed, interrupted, unreachable), 2 usage or config error,
3 the model lock is held (never for a dry run), 4 the model is paused and `--force`
was not given, 5 a node's mlx-medic is misconfigured for the run (nothing was done;
the fix is its next action).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.cli_common import (
    CliError,
    OnCall,
    add_config_argument,
    fail,
    run_oncall,
)
from mlx_medic.remediator.cli_log import RUN_HEADER, format_run
from mlx_medic.remediator.config import ConfigError
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import ControlView
from mlx_medic.remediator.outcomes import RunOutcome
from mlx_medic.remediator.playbooks import Playbook, builtin_playbooks
from mlx_medic.transport import SshTransport

EXIT_BY_OUTCOME: dict[str, int] = {
    RunOutcome.SUCCEEDED: 0,
    RunOutcome.PLANNED: 0,
    RunOutcome.LOCKED: 3,
    RunOutcome.MISCONFIGURED: 5,
}
EXIT_PAUSED = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("model", help="the model's name in the inventory")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="plan and journal every step; take no lock, ask no node, execute nothing",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="run even though the model is paused (journaled as an override)",
    )


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: remediate(oncall, args), writes=True)


def remediate(oncall: OnCall, args: argparse.Namespace) -> int:
    inventory = oncall.load_inventory()
    names = [m.name for m in inventory.models]
    if args.model not in names:
        raise oncall.unknown_model(args.model, names)
    control = oncall.journal.blocking_control(args.model)
    if control is not None and control.kind == "pause":
        if not args.force:
            return _refuse_paused(oncall, args.model, control)
        _record_override(oncall, args.model, control)
    try:
        return asyncio.run(_remediate(oncall, args, inventory))
    except KeyboardInterrupt:
        print("interrupted; the run is journaled as interrupted", file=sys.stderr)
        return 1


def _paused_by(model: str, control: ControlView) -> str:
    scope = model if control.model else "all models"
    return f"{scope} paused by {control.by_whom} ({control.reason})"


def _refuse_paused(oncall: OnCall, model: str, control: ControlView) -> int:
    fail(
        CliError(
            f"{model} is paused: {_paused_by(model, control)}; nothing was run. Add --force"
            " to run it anyway (journaled as an override), or resume first:"
            f" `{oncall.command('resume', *([control.model] if control.model else []))}`"
        )
    )
    return EXIT_PAUSED


def _record_override(oncall: OnCall, model: str, control: ControlView) -> None:
    detail = (
        f"{oncall.actor} ran the playbook by hand with --force while {_paused_by(model, control)}"
    )
    oncall.journal.add_event("override", now=time.time(), model=model, detail=detail)
    print(f"mlx-medic: override journaled: {detail}", file=sys.stderr)


async def _remediate(oncall: OnCall, args: argparse.Namespace, inventory: Inventory) -> int:
    config, journal = oncall.config, oncall.journal
    async with manual_engine(oncall, inventory) as engine:
        run_id = await engine.run_manual(args.model, dry_run=args.dry_run or config.dry_run)
    view = journal.get_run(run_id)
    assert view is not None
    print(RUN_HEADER)
    print("\n".join(format_run(view)))
    return EXIT_BY_OUTCOME.get(view.outcome, 1)


@asynccontextmanager
async def manual_engine(
    oncall: OnCall, inventory: Inventory, playbooks: Mapping[str, Playbook] | None = None
) -> AsyncIterator[Engine]:
    """An engine for by-hand runs over SSH, on the service's config and journal, with
    `playbooks` beside the built-in ones (`drain`, `undrain`)."""
    transport = SshTransport(inventory)
    try:
        engine = Engine(
            oncall.config,
            inventory,
            oncall.journal,
            transport,
            playbooks={**builtin_playbooks(oncall.config), **(playbooks or {})},
            registry=CollectorRegistry(),
            config_source=oncall.source,
        )
    except ConfigError as exc:
        await transport.close()
        raise CliError(f"config: {exc}") from exc
    try:
        yield engine
    finally:
        await engine.close()
        await transport.close()
