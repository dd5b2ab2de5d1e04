"""`mlx-medic undrain NODE`: end a drain (`mlx-medic drain NODE`) once the node rebooted.

It asks the node for its boot id: the same as at the drain means it has not rebooted,
and nothing is done. Otherwise the node's protection-domain ledger is this new boot's
(the ledger is kept per boot: it starts empty), the drained models' pauses are cleared,
and each model gets an `undrain` run, the recover playbook's steps: stop, sweep every
node, clean, start (the serve wrapper tries JACCL with its smoke test and falls back to
ring, as every start does), verify with a real request, and the ring pin after a failed
JACCL verify. Then the drain record on the node is removed (`node drain clear`), the
drain's silences are expired and the undrain journaled. Every
step is journaled: the pauses cleared, each run with its steps, the silences, the end.

Exit status: 0 undrained and every model verified; 1 the node has not rebooted (nothing
done), or a model's run did not succeed, or the node's drain record could not be removed
or a silence expired (the drain is ended all the same; said on stderr); 2 usage, config,
not drained, the node did not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.cli_common import CliError, OnCall, add_config_argument, run_oncall
from mlx_medic.remediator.cli_drain import (
    checked_node,
    drain_playbooks,
    node_drain_record,
    node_facts,
    run_playbook,
)
from mlx_medic.remediator.cli_remediate import manual_engine
from mlx_medic.remediator.drain import (
    UNDRAIN_EVENT,
    DrainRecord,
    SilenceError,
    expire_silence,
    open_drains,
    undrain_detail,
)
from mlx_medic.remediator.playbooks.drain import UNDRAIN

EXIT_NOT_REBOOTED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("node", help="the drained node's name in the inventory")


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: undrain(oncall, args.node), writes=True)


def undrain(oncall: OnCall, node_name: str) -> int:
    inventory = oncall.load_inventory()
    node = checked_node(inventory, node_name, oncall.config.inventory)
    record = open_drains(oncall.journal).get(node)
    if record is None:
        raise CliError(f"{node} is not drained; nothing to undo")
    return asyncio.run(_undrain(oncall, inventory, record))


async def _undrain(oncall: OnCall, inventory: Inventory, record: DrainRecord) -> int:
    node, journal, by = record.node, oncall.journal, oncall.actor
    known = {m.name for m in inventory.models}
    models = [inventory.model(name) for name in record.models if name in known]
    problems: list[str] = []
    async with manual_engine(oncall, inventory, drain_playbooks(node)) as engine:
        facts = await node_facts(engine, node, models[0].name if models else None)
        if facts.boot_id == record.boot_id:
            print(
                f"{node} has not rebooted since the drain: its boot id is still"
                f" {record.boot_id}; nothing was done. Reboot it, then run this again.",
                file=sys.stderr,
            )
            return EXIT_NOT_REBOOTED

        def step(said: str) -> None:
            journal.add_event(UNDRAIN_EVENT + "-step", now=time.time(), detail=f"{node}: {said}")
            print(said)

        spent = sum(s.domains for s in facts.survivors)
        step(
            f"{node} rebooted: boot {record.boot_id} -> {facts.boot_id}; its protection-domain"
            f" ledger is the new boot's ({len(facts.survivors)} survivor(s), {spent} domain(s))"
        )
        for model in models:
            if journal.clear_pause(model.name):
                journal.add_event(
                    "resumed",
                    now=time.time(),
                    model=model.name,
                    detail=f"cleared the pause of {model.name}: undrain of {node} ({by})",
                )
            print(f"resumed automatic remediation of {model.name}")
        for model in models:
            if not await run_playbook(engine, model.name, UNDRAIN):
                problems.append(f"{model.name} not verified (see its {UNDRAIN} run)")
        cleared = await node_drain_record(engine, node, "clear")
        if cleared:
            problems.append(cleared)
        else:
            step(f"removed the drain record on {node}")
        for silence in record.silences:
            assert record.alertmanager is not None
            try:
                expire_silence(record.alertmanager, silence)
            except SilenceError as exc:
                problems.append(f"silence {silence} not expired: {exc}")
                continue
            step(f"expired silence {silence}")
    said = "; ".join(problems) or f"{', '.join(record.models) or 'no model'} back and verified"
    journal.add_event(UNDRAIN_EVENT, now=time.time(), detail=undrain_detail(node, said))
    print(f"undrained {node}: {said}")
    return 1 if problems else 0
