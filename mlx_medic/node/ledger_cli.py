"""`mlx-medic node ledger`: this node's protection-domain ledger for this boot, per RDMA
device, with the survivors of SIGKILL still alive here, each model's reserve and whether a
JACCL start of it may still be tried here."""

from __future__ import annotations

import argparse
from typing import Any

from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.processes.placement import hostfile_devices
from mlx_medic.state.ledger import (
    LedgerError,
    debt_by_device,
    jaccl_allowed,
    live_survivors,
    read_ledger,
    start_debt,
)

PORT = ", listening on the model's port"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    try:
        ledger = read_ledger(context.state_dir, context.node)
    except LedgerError as exc:
        raise HelperError(str(exc)) from None
    models = context.inventory.models_on(context.node) if context.inventory else []
    units = ledger.debt_by_unit()
    reserves: dict[str, dict[str, Any]] = {}
    for model in models:
        devices = list(hostfile_devices(model, context.node))
        reserve = model.policy.pd_reserve
        reserves[model.name] = {
            "reserve": reserve,
            "devices": devices,
            "jaccl_allowed": jaccl_allowed(units, reserve, devices),
            "debt": start_debt(units, devices),
        }
    known = {d for r in reserves.values() for d in r["devices"]}
    by_device = debt_by_device(units, known)
    survivors = [(entry, entry.survivor(context.node).domains) for entry in live_survivors(ledger)]
    document = {
        "node": ledger.node,
        "boot_id": ledger.boot_id,
        "debt": ledger.debt,
        "debt_by_unit": units,
        "debt_by_device": by_device,
        "disputed_cycles": ledger.disputed_cycles,
        "reserves": reserves,
        "survivors": [
            {
                "pid": e.pid,
                "start_time": e.start_time,
                "cmdline": list(e.cmdline),
                "model": e.model,
                "backend": e.backend,
                "devices": list(e.devices),
                "domains": domains,
                "holds_port": e.holds_port,
                "at": e.at,
            }
            for e, domains in survivors
        ],
        "entries": [entry.to_json() for entry in ledger.entries],
    }
    lines = [
        f"node {ledger.node}, boot {ledger.boot_id}: {ledger.debt} process(es) counted as"
        f" spending protection domains, {ledger.disputed_cycles} disputed init/teardown"
        " cycle(s) or failed start(s) (not counted)"
    ]
    lines += [f"  {device}: {count} spent" for device, count in by_device.items()]
    lines += [
        f"  survivor of SIGKILL: pid {e.pid} (model {e.model}, {e.backend or 'unknown'}"
        f" backend, holding {domains} protection domain(s)"
        f"{' on ' + ', '.join(e.devices) if e.devices else ''}"
        f"{PORT if e.holds_port else ''}): reboot {ledger.node} to end it"
        for e, domains in survivors
    ]
    lines += [
        f"  model {name}: reserve {r['reserve']} per device, JACCL"
        f" {'allowed' if r['jaccl_allowed'] else 'refused'} ({r['debt']} spent on the"
        f" busiest of {', '.join(r['devices']) if r['devices'] else 'every device here'})"
        for name, r in reserves.items()
    ]
    emit("ledger", document, args.json, "\n".join(lines))
    return EXIT_OK
