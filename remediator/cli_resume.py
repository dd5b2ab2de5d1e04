"""`mlx-medic resume [MODEL]`: allow automatic action again.

With MODEL: clears that model's pause and closes its circuit (which also starts
a fresh restart budget). Without: clears only the pause of all models, and lists
what still blocks each model, so closing a circuit stays a deliberate act."""

from __future__ import annotations

import argparse
import time

from mlx_medic.remediator.cli_common import (
    CliError,
    add_config_argument,
    fail,
    load_cli_config,
    open_journal,
    who,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("model", nargs="?", default=None,
                        help="the model to resume; closes its circuit too (default: the"
                        " pause of all models only)")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_cli_config(args)
        journal = open_journal(config)
    except CliError as exc:
        return fail(exc)
    now, by = time.time(), who()
    done: list[str] = []
    if args.model is None:
        if journal.clear_pause(None):
            done.append("cleared the pause of all models")
    else:
        if journal.clear_pause(args.model):
            done.append(f"cleared the pause of {args.model}")
        if journal.close_circuit(args.model, now):
            done.append(f"closed the circuit of {args.model} (its restart budget starts afresh)")
    for line in done:
        journal.add_event("resumed", now=now, model=args.model, detail=f"{line} ({by})")
        print(line)
    if not done:
        print(f"{args.model or 'all models'}: nothing was paused or open; nothing changed")
    remaining = [
        c for c in journal.controls() if args.model is None or c.model in (None, args.model)
    ]
    for control in remaining:
        scope = control.model or "all models"
        undo = f"mlx-medic resume {control.model}" if control.model else "mlx-medic resume"
        state = "paused" if control.kind == "pause" else "circuit open"
        print(f"still {state}: {scope} ({control.reason}); clear with `{undo}`")
    return 0
