"""`mlx-medic node run MODEL show|set|renew|clear`: the model's current run on this node
and the run's lease, as the serve wrapper records them on every node of its run.

`clear RUN_ID` ends the run's lease but keeps the current run recorded (decided): after a
clean stop, the exporter's stale_run_id rule still needs to know which run was the last,
so a leftover of an earlier run stays an orphan. Nothing changes when RUN_ID is not the
current run (exit 1): a wrapper never ends a newer run's lease.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from mlx_medic.node.cli import (
    EXIT_FAILED,
    EXIT_OK,
    BadArguments,
    HelperError,
    add_node_arguments,
    emit,
    node_context,
)
from mlx_medic.node.model_arg import placed_model
from mlx_medic.node.record_lock import exclusive
from mlx_medic.state.files import StateFileError, remove_record
from mlx_medic.state.runs import (
    RunLease,
    check_run_id,
    current_run_path,
    lease_path,
    read_current_run,
    read_lease,
    record_current_run,
    record_lease,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an inventory model placed on this node")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the current run and its lease")
    set_ = actions.add_parser("set", help="record RUN_ID as current (and its lease, if given)")
    renew = actions.add_parser("renew", help="extend the lease of RUN_ID if it is current")
    clear = actions.add_parser("clear", help="end RUN_ID's lease if it is current")
    for sub, lease_required in ((set_, False), (renew, True)):
        sub.add_argument(
            "--lease",
            type=float,
            required=lease_required,
            metavar="SECONDS",
            help="the lease's length from now",
        )
        sub.add_argument(
            "--holder",
            required=lease_required,
            default=None,
            help="who renews it, e.g. 'serve pid 4242 on ai001'",
        )
    for sub in (set_, renew, clear):
        sub.add_argument("run_id", metavar="RUN_ID")
    for sub in (show, set_, renew, clear):
        add_node_arguments(sub)


def _lease(lease: RunLease | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {"run_id": lease.run_id, "expires_at": lease.expires_at, "holder": lease.holder}


def _state(state_dir: Path, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "current": read_current_run(state_dir, model),
        "lease": _lease(read_lease(state_dir, model)),
    }


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    model = placed_model(context, args.model).name
    state_dir = context.state_dir
    action: str = args.action
    if action != "show":
        try:
            check_run_id(args.run_id)
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
        if action == "set" and (args.lease is None) != (args.holder is None):
            raise BadArguments("--lease and --holder go together")
        lease = getattr(args, "lease", None)
        if lease is not None and not (math.isfinite(lease) and lease > 0):
            raise BadArguments(f"--lease {lease:g}: a lease is a positive number of seconds")
    changed = False
    try:
        if action == "show":
            document = _state(state_dir, model)
        else:
            with exclusive(current_run_path(state_dir, model).with_suffix(".guard")):
                current = read_current_run(state_dir, model)
                if action == "set":
                    record_current_run(state_dir, model, args.run_id)
                    if args.lease is not None:
                        record_lease(state_dir, model, args.run_id, args.lease, args.holder)
                    changed = True
                elif current == args.run_id and action == "renew":
                    record_lease(state_dir, model, args.run_id, args.lease, args.holder)
                    changed = True
                elif current == args.run_id:
                    changed = remove_record(lease_path(state_dir, model))
                document = _state(state_dir, model)
    except (StateFileError, ValueError) as exc:
        raise HelperError(str(exc)) from None
    refused = action in ("renew", "clear") and document["current"] != args.run_id
    document |= {"action": action, "changed": changed}
    if refused:
        document["refused"] = f"run {args.run_id} is not current here ({document['current']})"
    current, lease = document["current"], document["lease"]
    text = f"{model}: current run {current or 'none'}, lease " + (
        f"{lease['run_id']} until {lease['expires_at']:.0f} ({lease['holder']})"
        if lease
        else "none"
    )
    emit("run", document, args.json, text)
    if refused:
        print(f"mlx-medic node run: {document['refused']}; nothing changed", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
