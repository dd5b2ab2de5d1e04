"""`mlx-medic node ledger`: this node's protection-domain ledger for this boot, with
each model's reserve and whether a JACCL start may still be tried here."""

from __future__ import annotations

import argparse

from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.node.ledger import LedgerError, jaccl_allowed, read_ledger


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    try:
        ledger = read_ledger(context.state_dir, context.node)
    except LedgerError as exc:
        raise HelperError(str(exc)) from None
    models = context.inventory.models_on(context.node) if context.inventory else []
    reserves = {
        model.name: {"reserve": model.policy.pd_reserve,
                     "jaccl_allowed": jaccl_allowed(ledger, model.policy.pd_reserve)}
        for model in models
    }  # fmt: skip
    document = {
        "node": ledger.node, "boot_id": ledger.boot_id, "debt": ledger.debt,
        "debt_by_unit": ledger.debt_by_unit(), "disputed_cycles": ledger.disputed_cycles,
        "reserves": reserves, "entries": [entry.to_json() for entry in ledger.entries],
    }  # fmt: skip
    lines = [
        f"node {ledger.node}, boot {ledger.boot_id}: {ledger.debt} protection domain(s)"
        f" spent, {ledger.disputed_cycles} disputed init/teardown cycle(s)"
    ]
    lines += [f"  {unit}: {count}" for unit, count in sorted(ledger.debt_by_unit().items())]
    lines += [f"  model {name}: reserve {r['reserve']},"
              f" JACCL {'allowed' if r['jaccl_allowed'] else 'refused'}"
              for name, r in reserves.items()]  # fmt: skip
    emit("ledger", document, args.json, "\n".join(lines))
    return EXIT_OK
