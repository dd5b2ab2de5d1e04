"""`mlx-medic node session --inventory INVENTORY [--node NAME]`: run many helpers in one
login (mlx_medic.node.session: the protocol on stdin and stdout).

The SSH transport opens one per node and sends every helper call through it; through a
key's forced command, each request is checked against that key's table exactly as its
own login would be (mlx_medic.node.forced_command). Run directly, it runs any node helper
but itself and the forced command: what its user could run anyway.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from mlx_medic.command_line import add_inventory_flag, version
from mlx_medic.node.cli import EXIT_BAD_ARGUMENTS, HELPERS, BadArguments
from mlx_medic.node.session import HelperSession, RunRequest

THIS_HELPER = "session"
NOT_IN_A_SESSION = (THIS_HELPER, "forced-command")
# What helpers import when they run, beyond their own modules: loaded once in the session
# so its children do not (tests/node/test_helper_session.py checks that none is missing).
LAZY_IMPORTS = (
    "encodings.ascii",
    "encodings.idna",
    "mlx_medic.cli",
    "mlx_medic.inventory.snapshot",
    "mlx_medic.logs",
    "mlx_medic.node.clean",
    "mlx_medic.node.facts",
    "mlx_medic.node.room",
    "mlx_medic.node.sweep",
    "mlx_medic.state.node_identity",
    "psutil",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inventory_flag(parser, "the inventory the helpers run with (required)")
    parser.add_argument(
        "--node", default=None, help="this node's name (default: <state_dir>/node-id)"
    )


def helpers_here() -> list[str]:
    return sorted(set(HELPERS) - set(NOT_IN_A_SESSION))


def preload() -> None:
    """Import what every helper runs, once, before the first fork: each helper's module,
    what they import as they run, and every platform seam (which one a helper picks is
    decided as it runs)."""
    import pkgutil

    import mlx_medic.platform

    for helper in helpers_here():
        importlib.import_module(HELPERS[helper][0])
    for module in LAZY_IMPORTS:
        importlib.import_module(module)
    for seam in pkgutil.iter_modules(mlx_medic.platform.__path__, "mlx_medic.platform."):
        importlib.import_module(seam.name)


def serve(run_request: RunRequest) -> int:
    """Load the helpers, then serve requests until stdin closes."""
    preload()
    gc.enable()  # the node command turned it off for a short-lived helper; this one lives
    gc.freeze()  # what is loaded stays shared with the children, untouched
    return HelperSession(run_request, version()).serve()


def run_direct(words: list[str]) -> int:
    """A request to a session run without a forced command: any helper but these two."""
    from mlx_medic.cli import main

    if len(words) < 3 or words[1] != "node" or words[2] not in helpers_here():
        print(
            f"mlx-medic node session: refused {' '.join(words[:3])!r}: not a node helper"
            f" this session runs ({', '.join(helpers_here())})",
            file=sys.stderr,
        )
        return EXIT_BAD_ARGUMENTS
    return main(words[1:])


def run(args: argparse.Namespace) -> int:
    if args.inventory is None:
        raise BadArguments("--inventory FILE is required: the inventory the helpers run with")
    return serve(run_direct)
