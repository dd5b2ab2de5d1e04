"""`mlx-medic node sweep MODEL`: end the model's processes on this node (see
mlx_medic.node.sweep for the scope and the guards); exit 0 when nothing targeted
survives or the sweep is settled (only unkillable survivors, none on the model's port:
each named, with the reboot that frees it, and recorded in the node's ledger), 1 when
something else survived (stderr names it), 2 for bad arguments. A process in scope that
this user may not signal (another user's) is in `not_ours` with its owner, left alone,
and changes no exit status: it is not the model's to end here (stderr names it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
    modes.add_argument(
        "--orphans-only",
        action="store_true",
        help="only what the exporter's orphan rules call orphans (never"
        " suspects, never the model's current run)",
    )
    modes.add_argument(
        "--run",
        metavar="RUN_ID",
        default=None,
        help="only the processes tagged with this run id (MLX_MEDIC_RUN_ID)",
    )
    modes.add_argument(
        "--start-sweep",
        action="store_true",
        help="the serve wrapper's start sweep, under the model lock: ends any"
        " process listening on the model's port (the default sweep ends one"
        " only when it does not answer the health probe, --run only its own"
        " run's)",
    )
    parser.add_argument(
        "--crashed-run",
        metavar="RUN_ID",
        default=None,
        help="with --start-sweep: the serve wrapper's own run that just"
        " crashed; its listener on the model's port is ended even when it"
        " answers (it is the wrapper's own)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="SIGTERM to SIGKILL for this sweep, at most policy.kill_grace"
        " (the serve wrapper's shorter grace for the ranks of a dead"
        " launch); default: policy.kill_grace",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="report what would be signalled; signal nothing"
    )
    add_node_arguments(parser)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds <= 600:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0 to 600 seconds")
    return seconds


def run(args: argparse.Namespace) -> int:
    from mlx_medic.node.sweep import Mode, NodeSweep
    from mlx_medic.platform.process_table import system_process_table
    from mlx_medic.processes.roles import PatternSet, classifier
    from mlx_medic.processes.survivors import survivors_of
    from mlx_medic.state.runs import check_run_id

    context = node_context(args)
    model = placed_model(context, args.model)
    inventory = context.inventory
    assert inventory is not None  # placed_model requires one
    for flag, value in (("--run", args.run), ("--crashed-run", args.crashed_run)):
        if value is not None:
            try:
                check_run_id(value)
            except ValueError as exc:
                raise BadArguments(f"{flag}: {exc}") from None
    if args.crashed_run is not None and not args.start_sweep:
        raise BadArguments("--crashed-run goes with --start-sweep only")
    mode = (
        Mode.ORPHANS_ONLY
        if args.orphans_only
        else Mode.RUN
        if args.run is not None
        else Mode.START_SWEEP
        if args.start_sweep
        else Mode.SCOPE
    )
    table = system_process_table(classifier(PatternSet.of(inventory)))
    report = NodeSweep(
        inventory=inventory,
        model=model,
        node=context.node,
        state_dir=context.state_dir,
        table=table,
        mode=mode,
        run_id=args.run,
        dry_run=args.dry_run,
        grace=args.grace,
        crashed_run=args.crashed_run,
    ).run()
    document = report.to_json()
    document["ledger"] = ledger_after(context.state_dir, context.node)
    emit("sweep", document, args.json, _text(document))
    for entry in document["not_ours"]:
        print(f"mlx-medic node sweep: {not_ours_words(entry)}", file=sys.stderr)
    if report.complete:
        return EXIT_OK
    verdict = survivors_of(model.name, {context.node: document})
    unkillable = {s.pid for s in verdict.survivors}
    for survivor in document["survivors"]:
        if survivor["pid"] not in unkillable:
            print(
                f"mlx-medic node sweep: pid {survivor['pid']} ({survivor['role']}) survives"
                f" the sweep on node {context.node}, state {survivor['state']}",
                file=sys.stderr,
            )
    for survivor in verdict.survivors:
        print(f"mlx-medic node sweep: {survivor.describe()}", file=sys.stderr)
    if verdict.blocked:
        print(f"mlx-medic node sweep: {verdict.refusal(inventory)}", file=sys.stderr)
    elif verdict.survivors:
        print(
            f"mlx-medic node sweep: recorded in the ledger; a start may go on around them;"
            f" {'; '.join(verdict.advice(inventory))}",
            file=sys.stderr,
        )
    return EXIT_OK if report.settled else EXIT_FAILED


def ledger_after(state_dir: Path, node: str) -> dict[str, Any]:
    """The node's ledger as the sweep leaves it (what a start is judged by), or why not."""
    from mlx_medic.state.ledger import LedgerError, read_ledger

    try:
        ledger = read_ledger(state_dir, node)
    except LedgerError as exc:
        return {"error": str(exc)}
    return {"boot_id": ledger.boot_id, "debt": ledger.debt, "debt_by_unit": ledger.debt_by_unit()}


def not_ours_words(entry: dict[str, Any]) -> str:
    """`pid 4242 (rank) is root's: may not signal it ...; it holds the model's port`."""
    port = (
        "; it listens on the model's port, so a start there fails until its owner ends it"
        if entry.get("holds_port")
        else ""
    )
    return (
        f"not ours: pid {entry['pid']} ({entry['role']}) is {entry['owner']}'s:"
        f" {entry['why']}{port}"
    )


def _text(document: dict) -> str:
    verb = "would signal" if document["dry_run"] else "signalled"
    lines = [
        f"sweep of {document['model']} on {document['node']} ({document['mode']}):"
        f" {len(document['signalled'])} {verb}, {len(document['exited'])} exited,"
        f" {len(document['survivors'])} survived, {document['pd_spent']} protection"
        " domain(s) spent"
        + (f", {len(document['not_ours'])} not ours" if document["not_ours"] else "")
    ]
    for entry in document["signalled"]:
        rule = f" [{entry['rule']}]" if entry["rule"] else ""
        lines.append(
            f"  {verb} {entry['pid']} {entry['role']}{rule}"
            f" {' '.join(entry['signals'])}: {' '.join(entry['cmdline'])[:160]}"
        )
    for entry in document["survivors"]:
        lines.append(f"  survivor {entry['pid']} {entry['role']} state {entry['state']}")
    for entry in document["spared"]:
        lines.append(f"  spared {entry['pid']}: {entry['reason']}")
    lines += [f"  {not_ours_words(entry)}" for entry in document["not_ours"]]
    return "\n".join(lines)
