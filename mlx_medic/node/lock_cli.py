"""`mlx-medic node lock MODEL show|take|replace|release|break`: the model lock's file on
the model's head, `<state_dir>/locks/<model>.lock`, as ModelLocks uses it from anywhere.

Each action is one compare-then-write on the head under an flock (record_lock), so two
takers, a renewer and a breaker never interleave: `take` creates the lock only when there
is none; `replace` rewrites it only while it holds the caller's token; `release` removes
it only while it holds the caller's token; `break` removes it only while its text is
exactly the one the caller judged stale (its SHA-256). Every document carries the lock's
text as it is after the action (or null), so the caller judges what is really there.
Exit 0 when the action happened (or `show`), 1 when the lock was not as required.
Who holds it, and whether that holder lives, is judged by the caller (ModelLocks), which
asks the holder's own node (`pid-alive`).
"""

from __future__ import annotations

import argparse
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
from mlx_medic.state.files import StateFileError
from mlx_medic.state.model_lock_file import act_and_read, checked_info, lock_path

ACTIONS = ("show", "take", "replace", "release", "break")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an inventory model whose head is this node")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the lock's text, or null")
    take = actions.add_parser("take", help="create the lock with --info if there is none")
    replace = actions.add_parser("replace", help="rewrite it while it holds --expected-token")
    release = actions.add_parser("release", help="remove it while it holds --token")
    break_ = actions.add_parser("break", help="remove it while its text has --expected-sha256")
    for sub in (take, replace):
        sub.add_argument("--info", required=True, metavar="JSON", help="the lock's JSON object")
    replace.add_argument("--expected-token", required=True, metavar="TOKEN")
    release.add_argument("--token", required=True)
    break_.add_argument("--expected-sha256", required=True, metavar="HEX")
    for sub in (show, take, replace, release, break_):
        add_node_arguments(sub)


def run(args: argparse.Namespace) -> int:
    context = node_context(args)
    model = placed_model(context, args.model, on_head=True).name
    path = lock_path(context.state_dir, model)
    if args.action in ("take", "replace"):
        try:
            checked_info(args.info)  # a bad --info is a bad command line, before anything
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
    try:
        state = act_and_read(
            path,
            args.action,
            info=getattr(args, "info", None),
            token=getattr(args, "token", None),
            expected_token=getattr(args, "expected_token", None),
            expected_sha256=getattr(args, "expected_sha256", None),
        )
    except StateFileError as exc:
        raise HelperError(str(exc)) from None
    document: dict[str, Any] = {
        "model": model,
        "action": args.action,
        "path": str(path),
        **state.to_document(),
    }
    text = state.text if state.text is not None else f"{model}: not locked"
    emit("lock", document, args.json, text)
    return EXIT_OK if state.done else EXIT_FAILED
