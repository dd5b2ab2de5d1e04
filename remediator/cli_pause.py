"""`mlx-medic pause [MODEL]`: the big red button. Stops automatic action for one
model or all of them, at once, in a running remediator too (it reads the same
journal before every decision). By-hand `mlx-medic remediate` still works."""

from __future__ import annotations

import argparse
import time

from mlx_medic.remediator.cli_common import (
    CliError,
    add_config_argument,
    fail,
    load_cli_config,
    load_cli_inventory,
    open_journal,
    who,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("model", nargs="?", default=None,
                        help="the model to pause (default: every model)")
    parser.add_argument("--reason", default="paused by hand", help="recorded in the journal")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_cli_config(args)
        warning = ""
        if args.model is not None:
            try:
                names = [m.name for m in load_cli_inventory(config).models]
            except CliError as exc:  # the button must work even with a broken inventory
                warning = f"warning: could not check the model name: {exc}"
            else:
                if args.model not in names:
                    raise CliError(
                        f"no model {args.model!r} in {config.inventory}"
                        f" (known: {', '.join(names) or 'none'})"
                    )
        journal = open_journal(config)
    except CliError as exc:
        return fail(exc)
    if warning:
        print(warning)
    scope = args.model or "all models"
    by = who()
    if journal.set_pause(args.model, reason=args.reason, by_whom=by, now=time.time()):
        journal.add_event("paused", now=time.time(), model=args.model,
                          detail=f"{scope} paused by {by}: {args.reason}")
        print(f"paused automatic remediation for {scope} (journal {config.journal})")
    else:
        print(f"{scope}: already paused; nothing changed")
    undo = f"mlx-medic resume {args.model}" if args.model else "mlx-medic resume"
    print(f"undo with: {undo}")
    return 0
