"""`mlx-medic node backend MODEL show|set auto|ring|jaccl --by TEXT --reason TEXT`: the
model's durable backend choice, kept on its head (state/backend_choice.py), which the serve
wrapper reads before it starts and `mlx-medic backend` shows or sets for a person."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from mlx_medic.node.cli import EXIT_OK, HelperError, add_node_arguments, emit, node_context
from mlx_medic.node.model_arg import placed_model
from mlx_medic.state.backend_choice import (
    CHOICES,
    BackendChoice,
    read_backend_choice,
    write_backend_choice,
)
from mlx_medic.state.files import StateFileError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an inventory model whose head is this node")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the recorded choice (auto when none)")
    set_ = actions.add_parser("set", help="record a choice")
    set_.add_argument("choice", choices=CHOICES, metavar="CHOICE", help="|".join(CHOICES))
    set_.add_argument("--by", required=True, help="who chooses: 'remediator run 12', a person")
    set_.add_argument("--reason", required=True, help="why, for the record")
    for sub in (show, set_):
        add_node_arguments(sub)


def describe(model: str, choice: BackendChoice) -> str:
    retry = choice.retry().replace("MODEL", model)
    if not choice.pinned and not choice.by:
        return f"{model}: auto (JACCL first, then ring): no choice recorded; {retry}"
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(choice.at))
    pinned = f"pinned to {choice.choice}" if choice.pinned else "auto (JACCL first, then ring)"
    return f"{model}: {pinned}, by {choice.by} at {when}: {choice.reason}; {retry}"


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    model = placed_model(context, args.model, on_head=True).name
    try:
        if args.action == "set":
            choice = write_backend_choice(
                context.state_dir, model, args.choice, by=args.by, reason=args.reason
            )
        else:
            choice = read_backend_choice(context.state_dir, model)
    except (StateFileError, ValueError) as exc:
        raise HelperError(str(exc)) from None
    document = {
        "model": model,
        "action": args.action,
        **asdict(choice),
        "pinned": choice.pinned,
        "automatic": choice.automatic,
        "retry": choice.retry(),
    }
    emit("backend", document, args.json, describe(model, choice))
    return EXIT_OK
