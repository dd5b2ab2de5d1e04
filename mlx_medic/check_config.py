"""`mlx-medic check-config`: validate an inventory or the remediator's config before
anything uses it.

`check-config FILE` tells which of the two the file is by its top-level keys
(`mlx_medic.config_kind`); `--inventory FILE` and `--config.file FILE` (the remediator's
config, as the service's flag names it) say it. A file of the other kind is named as
such. Exit 0: valid; 1: the file was read and has problems, every one listed; 2: usage
(the file cannot be read, a bad flag, or a kind that cannot be told).

An inventory is loaded exactly as the exporter and the remediator load it
(`load_inventory`, the same models), so what it accepts they accept, and check-config
says which tmp/cache dirs several models on a node share (`tmp_rules.scope_dirs`:
weighed once, with the longest stale age). `--schema` prints the field reference
generated from those models (docs/inventory.md holds the same table). A model whose JACCL
is the testbed's simulation (`serve.simulated_jaccl`) is refused unless
`--allow-simulated-jaccl` says this is a testbed: a real cluster must never believe a
simulated backend.

The login user (`nodes.<name>.user`, default `ssh.user`) is what the remediator's and the
serve wrapper's keys run the node helpers as: root is refused unless the inventory says
`ssh.allow_root_login: true`, so a root login is always a written choice. A model whose
`service.user` is not its nodes' login user is warned about: the helpers cannot signal
another user's ranks, so its sweeps would fail.

The remediator's config is checked by `mlx_medic.remediator.config_check` as the service
checks it before it listens, the inventory it names included. That module is imported by
name, as the CLI imports a command's, so the inventory's path loads nothing of the
remediator (shared code imports no deployable: tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from mlx_medic.config_kind import INVENTORY_KEYS, REMEDIATOR_KEYS, Kind, detect_kind, keys_of_each
from mlx_medic.file_problems import FileProblems
from mlx_medic.inventory.fields import DEFAULT_LOGIN_USER
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.reference import human_duration
from mlx_medic.inventory.schema import Inventory
from mlx_medic.tmp_rules import ScopeDir, scope_dirs
from mlx_medic.yaml_config import parse_mapping, read_text

EXIT_PROBLEMS = 1
EXIT_USAGE = 2
REMEDIATOR_CHECK = "mlx_medic.remediator.config_check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 valid; 1 the file was read and has problems (every one is listed);"
        " 2 the file cannot be read, a bad flag, or a file whose kind cannot be told"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "file",
        type=Path,
        nargs="?",
        help="an inventory or the remediator's config, told apart by their top-level keys",
    )
    what.add_argument("--inventory", type=Path, metavar="FILE", help="an inventory")
    what.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        metavar="FILE",
        help="the remediator's config (what `mlx-medic remediator --config.file` reads),"
        " with the inventory it names",
    )
    what.add_argument(
        "--schema",
        action="store_true",
        help="print every inventory field (path, type, default, meaning) and exit",
    )
    parser.add_argument(
        "--allow-simulated-jaccl",
        action="store_true",
        help="accept serve.simulated_jaccl in an inventory (the testbed's simulated JACCL;"
        " never on a real cluster)",
    )


def run(args: argparse.Namespace) -> int:
    if args.schema:
        from mlx_medic.inventory.reference import reference

        print(reference())
        return 0
    try:
        path, kind = _file_and_kind(args)
        if kind == "remediator":
            return int(importlib.import_module(REMEDIATOR_CHECK).check(path))
        return check_inventory(path, args.allow_simulated_jaccl)
    except FileProblems as exc:
        if exc.unreadable:
            print(f"mlx-medic check-config: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(exc.report(), file=sys.stderr)
        return EXIT_PROBLEMS
    except UnknownKind as exc:
        print(f"mlx-medic check-config: {exc}", file=sys.stderr)
        return EXIT_USAGE


class UnknownKind(Exception):
    """The file's top-level keys say neither kind, or both."""


def _file_and_kind(args: argparse.Namespace) -> tuple[Path, Kind]:
    """The file and its kind, as a flag says or its top-level keys tell."""
    if args.inventory is not None:
        return args.inventory, "inventory"
    if args.config_file is not None:
        return args.config_file, "remediator"
    path: Path = args.file
    raw = parse_mapping(read_text(path, str(path), FileProblems), str(path), FileProblems, None)
    detected = detect_kind(raw)
    if detected is None:
        raise UnknownKind(
            f"{path}: {_why_unknown(raw)}; pass --inventory {path} or --config.file {path}"
        )
    return path, detected.kind


def _why_unknown(raw: dict) -> str:
    each = keys_of_each(raw)
    if each["inventory"] and each["remediator"]:
        return (
            f"it has keys of both an inventory ({', '.join(each['inventory'])}) and the"
            f" remediator's config ({', '.join(each['remediator'])})"
        )
    return (
        f"its top-level keys ({', '.join(map(str, raw)) or 'none'}) are neither an"
        f" inventory's ({', '.join(INVENTORY_KEYS[:2])}, ...) nor the remediator's config's"
        f" ({', '.join(REMEDIATOR_KEYS[:2])}, ...)"
    )


def check_inventory(path: Path, allow_simulated_jaccl: bool) -> int:
    """0 and the ok line (with warnings and the shared dirs), else 1 and the problem."""
    inventory = load_inventory(path)
    simulated = [m.name for m in inventory.models if m.serve.simulated_jaccl]
    if simulated and not allow_simulated_jaccl:
        print(
            f"{path}: models.{simulated[0]}.serve.simulated_jaccl: true: JACCL would be"
            " the testbed's simulation (testbed/README.md), which a real cluster must"
            " never run; remove it, or pass --allow-simulated-jaccl on a testbed"
            f" (models: {', '.join(simulated)})",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    refused = root_login_problem(inventory)
    if refused:
        print(f"{path}: {refused}", file=sys.stderr)
        return EXIT_PROBLEMS
    for warning in login_user_warnings(inventory):
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(
        f"{path}: ok: {len(inventory.nodes)} nodes, {len(inventory.models)} models"
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
