"""`mlx-medic check-config FILE`: validate an inventory before anything uses it.

It loads the file exactly as the exporter and the remediator do (`load_inventory`, the
same models), so what it accepts they accept, and says which tmp/cache dirs several
models on a node share (`tmp_rules.scope_dirs`: weighed once, with the longest stale
age). `--schema` prints the field reference generated from those models
(docs/inventory.md holds the same table). A model whose JACCL is the testbed's simulation
(`serve.simulated_jaccl`) is refused unless `--allow-simulated-jaccl` says this is a
testbed: a real cluster must never believe a simulated backend.

The login user (`nodes.<name>.user`, default `ssh.user`) is what the remediator's and the
serve wrapper's keys run the node helpers as: root is refused unless the inventory says
`ssh.allow_root_login: true`, so a root login is always a written choice. A model whose
`service.user` is not its nodes' login user is warned about: the helpers cannot signal
another user's ranks, so its sweeps would fail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlx_medic.inventory.fields import DEFAULT_LOGIN_USER
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.reference import human_duration
from mlx_medic.inventory.schema import Inventory
from mlx_medic.tmp_rules import ScopeDir, scope_dirs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("file", type=Path, nargs="?", help="inventory YAML")
    what.add_argument(
        "--schema",
        action="store_true",
        help="print every inventory field (path, type, default, meaning) and exit",
    )
    parser.add_argument(
        "--allow-simulated-jaccl",
        action="store_true",
        help="accept serve.simulated_jaccl (the testbed's simulated JACCL; never on a real"
        " cluster)",
    )


def run(args: argparse.Namespace) -> int:
    if args.schema:
        from mlx_medic.inventory.reference import reference

        print(reference())
        return 0
    try:
        inventory = load_inventory(args.file)
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    simulated = [m.name for m in inventory.models if m.serve.simulated_jaccl]
    if simulated and not args.allow_simulated_jaccl:
        print(
            f"{args.file}: models.{simulated[0]}.serve.simulated_jaccl: true: JACCL would be"
            " the testbed's simulation (testbed/README.md), which a real cluster must"
            " never run; remove it, or pass --allow-simulated-jaccl on a testbed"
            f" (models: {', '.join(simulated)})",
            file=sys.stderr,
        )
        return 1
    refused = root_login_problem(inventory)
    if refused:
        print(f"{args.file}: {refused}", file=sys.stderr)
        return 1
    for warning in login_user_warnings(inventory):
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    print(
        f"{args.file}: ok: {len(inventory.nodes)} nodes, {len(inventory.models)} models"
        + "".join(f"\n  {m.name}: {' -> '.join(m.nodes)} port {m.port}" for m in inventory.models)
    )
    print("\n".join(shared_dirs_report(inventory)))
    return 0


def shared_dirs_report(inventory: Inventory) -> list[str]:
    """Which tmp/cache dirs several models on a node share, and the stale age they get."""
    nodes: dict[ScopeDir, list[str]] = {}
    for node in inventory.nodes:
        for scope in scope_dirs(inventory.models_on(node.name)):
            if scope.shared:
                nodes.setdefault(scope, []).append(node.name)
    if not nodes:
        return ["shared dirs: none"]
    lines = [
        "shared dirs (weighed once; an entry is stale only when no process uses it and it"
        " is older than every sharing model's stale_tmp_age):"
    ]
    for scope, where in nodes.items():
        lines.append(
            f"  {scope.path} on {', '.join(where)}: {', '.join(scope.models)}"
            f" (stale after {human_duration(scope.stale_age)})"
        )
    return lines


def root_login_problem(inventory: Inventory) -> str | None:
    """Why the inventory's root login is refused, or None (no root, or allowed)."""
    roots = [node.name for node in inventory.nodes if node.user == "root"]
    if not roots or inventory.ssh.allow_root_login:
        return None
    where = "ssh.user" if inventory.ssh.user == "root" else "nodes.<name>.user"
    return (
        f"{where}: root is the SSH login user on {', '.join(roots)}: the remediator's and"
        " the serve wrapper's keys would run the node helpers as root; name a dedicated"
        f" user (ssh.user, default {DEFAULT_LOGIN_USER}), or set ssh.allow_root_login: true"
    )


def login_user_warnings(inventory: Inventory) -> list[str]:
    """A model whose service user is not its nodes' login user: its sweeps would fail."""
    warnings = []
    for model in inventory.models:
        wanted = model.service.user
        others = [n for n in model.nodes if wanted and inventory.node(n).user != wanted]
        if others:
            users = sorted({inventory.node(n).user for n in others})
            warnings.append(
                f"models.{model.name}.service.user is {wanted}, but the login user of"
                f" {', '.join(others)} is {', '.join(users)} (nodes.<name>.user, default"
                f" ssh.user): the node helpers run as the login user and cannot signal"
                f" {wanted}'s ranks, so the model's sweeps would fail"
            )
    return warnings
