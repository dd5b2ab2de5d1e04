"""`mlx-medic pause [MODEL]`: the big red button. Stops automatic action for one
model or all of them, at once, in a running remediator too (it reads the same
journal before every decision). A by-hand `mlx-medic remediate` of a paused model
needs `--force`.

Exit status: 0 paused in the service's journal (or it already was: nothing to change);
1 the pause is written but MODEL could not be checked against the inventory (a name the
service does not know pauses nothing); 2 nothing written: no config to tell the service's
journal, unknown model, journal not writable.
"""

from __future__ import annotations

import argparse
import sys
import time

from mlx_medic.remediator.cli_common import CliError, OnCall, add_config_argument, run_oncall


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "model", nargs="?", default=None, help="the model to pause (default: every model)"
    )
    parser.add_argument("--reason", default="paused by hand", help="recorded in the journal")


def run(args: argparse.Namespace) -> int:
    return run_oncall(args, lambda oncall: pause(oncall, args.model, args.reason), writes=True)


def pause(oncall: OnCall, model: str | None, reason: str) -> int:
    unchecked = ""
    if model is not None:
        try:
            names = oncall.model_names()
        except CliError as exc:  # the button must work even with a broken inventory
            unchecked = str(exc)
        else:
            if model not in names:
                raise oncall.unknown_model(model, names)
    scope = model or "all models"
    journal, by, now = oncall.journal, oncall.actor, time.time()
    if journal.set_pause(model, reason=reason, by_whom=by, now=now):
        journal.add_event(
            "paused", now=now, model=model, detail=f"{scope} paused by {by}: {reason}"
        )
        print(f"paused automatic remediation for {scope} (journal {oncall.config.journal})")
    else:
        print(f"{scope}: already paused in the journal {oncall.config.journal}; nothing to change")
    print(f"undo with: {oncall.command('resume', *([model] if model else []))}")
    if unchecked:
        print(
            f"mlx-medic: warning: the pause of {model!r} is written, but the name could not"
            f" be checked against the inventory ({unchecked}); a name the service does not"
            f" know pauses nothing: `{oncall.command('pause')}` pauses every model",
            file=sys.stderr,
        )
        return 1
    return 0
