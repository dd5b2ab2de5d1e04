"""`mlx-medic node sweep MODEL`: end the model's processes on this node (see
mlx_medic.node.sweep for the scope and the guards); exit 0 when nothing targeted
survives, 1 when something did (stderr names the node; for an unkillable one, says to
reboot it), 2 for bad arguments."""

from __future__ import annotations

import argparse
import sys

from mlx_medic.node.cli import (
    EXIT_FAILED,
    EXIT_OK,
    BadArguments,
    add_node_arguments,
    emit,
    node_context,
)
from mlx_medic.node.model_arg import placed_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the inventory model to sweep")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--orphans-only", action="store_true",
                       help="only what the exporter's orphan rules call orphans (never"
                       " suspects, never the model's current run)")  # fmt: skip
    modes.add_argument("--run", metavar="RUN_ID", default=None,
                       help="only the processes tagged with this run id (MLX_MEDIC_RUN_ID)")
    modes.add_argument("--start-sweep", action="store_true",
                       help="the serve wrapper's start sweep, under the model lock: ends any"
                       " process listening on the model's port (the default sweep ends one"
                       " only when it does not answer the health probe, --run only its own"
                       " run's)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true",
                        help="report what would be signalled; signal nothing")
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node.sweep import Mode, Sweep
    from mlx_medic.platform.process_table import system_process_table
    from mlx_medic.process_model import PatternSet, classifier
    from mlx_medic.runs import check_run_id

    context = node_context(args)
    model = placed_model(context, args.model)
    inventory = context.inventory
    assert inventory is not None  # placed_model requires one
    if args.run is not None:
        try:
            check_run_id(args.run)
        except ValueError as exc:
            raise BadArguments(f"--run: {exc}") from None
    mode = (Mode.ORPHANS_ONLY if args.orphans_only else Mode.RUN if args.run is not None
            else Mode.START_SWEEP if args.start_sweep else Mode.SCOPE)  # fmt: skip
    table = system_process_table(classifier(PatternSet.of(inventory)))
    report = Sweep(inventory=inventory, model=model, node=context.node,
                   state_dir=context.state_dir, table=table, mode=mode, run_id=args.run,
                   dry_run=args.dry_run).run()  # fmt: skip
    document = report.to_json()
    emit("sweep", document, args.json, _text(document))
    if report.complete:
        return EXIT_OK
    unkillable = {s["pid"] for s in document["unkillable"]}
    for survivor in document["survivors"]:
        what = (f"pid {survivor['pid']} ({survivor['role']}) survives the sweep on node"
                f" {context.node}, state {survivor['state']}")  # fmt: skip
        if survivor["pid"] in unkillable:
            what += f": unkillable (uninterruptible sleep); reboot node {context.node}"
        print(f"mlx-medic node sweep: {what}", file=sys.stderr)
    return EXIT_FAILED


def _text(document: dict) -> str:
    verb = "would signal" if document["dry_run"] else "signalled"
    lines = [f"sweep of {document['model']} on {document['node']} ({document['mode']}):"
             f" {len(document['signalled'])} {verb}, {len(document['exited'])} exited,"
             f" {len(document['survivors'])} survived, {document['pd_spent']} protection"
             " domain(s) spent"]  # fmt: skip
    for entry in document["signalled"]:
        rule = f" [{entry['rule']}]" if entry["rule"] else ""
        lines.append(f"  {verb} {entry['pid']} {entry['role']}{rule}"
                     f" {' '.join(entry['signals'])}: {' '.join(entry['cmdline'])[:160]}")
    for entry in document["survivors"]:
        lines.append(f"  survivor {entry['pid']} {entry['role']} state {entry['state']}")
    for entry in document["spared"]:
        lines.append(f"  spared {entry['pid']}: {entry['reason']}")
    return "\n".join(lines)
