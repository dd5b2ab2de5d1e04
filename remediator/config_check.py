"""`mlx-medic check-config` for the remediator's config: what the service checks before it
listens (service.py), without starting it.

The file is read as the service reads it (`read_config`: every problem with its line);
then the routes are checked against the built-in playbooks, the inventory it names is
loaded (its problems are said under its own name) and `node` is looked up in it. The
credential and TLS files are not read: they are the service user's, not the caller's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mlx_medic.file_problems import FileProblems
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.remediator.config import (
    FLAG_FOUND_BY,
    ConfigError,
    ConfigSource,
    check_routing,
    read_config,
)
from mlx_medic.remediator.model_health import remediator_node
from mlx_medic.remediator.playbooks import builtin_playbooks


def check(path: Path) -> int:
    """0 and the ok line, else 1 and every problem on stderr; a ConfigFileError when the
    file itself cannot be used (the caller reports it)."""
    config = read_config(ConfigSource(path, FLAG_FOUND_BY))
    problems: list[str] = []
    try:
        check_routing(config.routing, builtin_playbooks(config))
    except ConfigError as exc:
        problems.append(str(exc))
    inventory_error: InventoryError | None = None
    try:
        inventory = load_inventory(config.inventory)
    except InventoryError as exc:
        if exc.unreadable:
            problems.append(f"inventory: {exc}")
        else:
            inventory_error = exc
            problems.append(f"inventory: {config.inventory} does not load (its problems follow)")
    else:
        try:
            remediator_node(config.node, inventory)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        print(FileProblems(str(path), problems).report(), file=sys.stderr)
        if inventory_error is not None:
            print(inventory_error.report(), file=sys.stderr)
        return 1
    if not config.auth.configured and not config.insecure_no_auth:
        print(
            f"{path}: warning: auth: no credentials configured (auth.bearer_token_file, or"
            " auth.basic_username + auth.basic_password_file): the service starts only with"
            " --insecure-no-auth",
            file=sys.stderr,
        )
    if config.auth.read_only_open and not config.insecure_no_auth:
        print(
            f"{path}: warning: auth.read_only_open: /, /api/* and /metrics are served to"
            " anyone who can reach the port (posting alerts still needs the credentials)",
            file=sys.stderr,
        )
    print(
        f"{path}: ok: remediator config (inventory {config.inventory}, journal"
        f" {config.journal}, listen {config.listen}, {len(config.routing.playbooks)} routes)"
    )
    return 0
