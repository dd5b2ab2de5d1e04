"""`mlx-medic resume [MODEL]`: allow automatic action again.

With MODEL: clears that model's pause and closes its circuit (which also starts
a fresh restart budget). Without: clears only the pause of all models, and lists
what still blocks each model, so closing a circuit stays a deliberate act.

Exit status: 0 resumed in the service's journal (or nothing there was paused or open);
1 nothing was paused or open for MODEL and the name could not be checked against the
inventory; 2 no config to tell the service's journal, unknown model, journal not writable.
"""

from __future__ import annotations

import argparse
import sys
import time

from mlx_medic.remediator.cli_common import CliError, OnCall, add_config_argument, run_oncall


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="the model to resume; closes its circuit too (default: the pause of all models only)",
    )


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: resume(oncall, args.model), writes=True)


def resume(oncall: OnCall, model: str | None) -> int:
    journal, now, by = oncall.journal, time.time(), oncall.actor
    done: list[str] = []
    if model is None:
        if journal.clear_pause(None):
            done.append("cleared the pause of all models")
    else:
        if journal.clear_pause(model):
            done.append(f"cleared the pause of {model}")
        if journal.close_circuit(model, now):
            done.append(f"closed the circuit of {model} (its restart budget starts afresh)")
    for line in done:
        journal.add_event("resumed", now=now, model=model, detail=f"{line} ({by})")
        print(line)
    status = 0
    if not done:
        if model is not None:
            status = _check_name(oncall, model)
        print(
            f"{model or 'all models'}: nothing was paused or open in the journal"
            f" {oncall.config.journal}; nothing changed"
        )
    remaining = [c for c in journal.controls() if model is None or c.model in (None, model)]
    for control in remaining:
        scope = control.model or "all models"
        undo = oncall.command("resume", *([control.model] if control.model else []))
        state = "paused" if control.kind == "pause" else "circuit open"
        print(f"still {state}: {scope} ({control.reason}); clear with `{undo}`")
    return status


def _check_name(oncall: OnCall, model: str) -> int:
    """0 for a model the inventory has; a CliError for one it has not (a typo resumes
    nothing); 1 with a warning when the inventory cannot be read."""
    try:
        names = oncall.model_names()
    except CliError as exc:
        print(
            f"mlx-medic: warning: could not check {model!r} against the inventory: {exc}",
            file=sys.stderr,
        )
        return 1
    if model not in names:
        raise oncall.unknown_model(model, names)
    return 0
