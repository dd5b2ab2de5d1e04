"""`mlx-medic node orphans [MODEL]`: this node's orphan report from the shared scan (the
exporter's rules): orphans with their rule and state, suspects apart (never swept)."""

from __future__ import annotations

import argparse
from typing import Any

from mlx_medic.node.cli import EXIT_OK, add_node_arguments, emit, node_context
from mlx_medic.node.model_arg import placed_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        default=None,
        help="only this model (with an inventory: one placed on this node;"
        " default: every model found)",
    )
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from mlx_medic.platform.process_table import system_process_table
    from mlx_medic.processes.orphan_scan import OrphanScan
    from mlx_medic.processes.roles import PatternSet, classifier

    context = node_context(args)
    inventory = context.inventory
    if args.model is not None and inventory is not None:
        placed_model(context, args.model)  # with an inventory: a model placed on this node
    table = system_process_table(classifier(PatternSet.of(inventory)))
    scan = OrphanScan(node=context.node, inventory=inventory, state_dir=context.state_dir)
    report = scan.scan(table.snapshot()).report

    def entry(found: Any) -> dict[str, Any]:
        proc = found.proc
        return {
            "pid": proc.pid,
            "start_time": proc.create_time,
            "cmdline": list(proc.cmdline),
            "model": found.model,
            "role": str(found.role),
            "state": str(proc.state),
            "rule": str(found.rule),
        }

    wanted = (lambda model: True) if args.model is None else (lambda model: model == args.model)
    orphans = [entry(o) for o in report.orphans if wanted(o.model)]
    suspects = [entry(s) for s in report.suspects if wanted(s.model)]
    lines = [f"node {context.node}: {len(orphans)} orphan(s), {len(suspects)} suspect(s)"]
    lines += [
        f"  orphan {e['pid']} {e['model']} {e['role']} {e['state']} [{e['rule']}]:"
        f" {' '.join(e['cmdline'])[:160]}"
        for e in orphans
    ]
    lines += [
        f"  suspect {e['pid']} {e['model']} {e['role']} {e['state']} [{e['rule']}]:"
        f" {' '.join(e['cmdline'])[:160]}"
        for e in suspects
    ]
    emit(
        "orphans",
        {"node": context.node, "model": args.model, "orphans": orphans, "suspects": suspects},
        args.json,
        "\n".join(lines),
    )
    return EXIT_OK
