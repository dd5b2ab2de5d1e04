"""What the on-call commands share: `--config.file` (the same file as the service,
so they find the same journal and inventory) and clear errors."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from pathlib import Path

from mlx_medic.inventory import Inventory, InventoryError, load_inventory
from mlx_medic.remediator.config import ConfigError, RemediatorConfig, load_config
from mlx_medic.remediator.journal import Journal


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config.file", dest="config_file", type=Path, default=None,
        help="remediator config (YAML), the one the service uses; embedded defaults without it",
    )


def load_cli_config(args: argparse.Namespace) -> RemediatorConfig:
    try:
        return load_config(getattr(args, "config_file", None))
    except ConfigError as exc:
        raise CliError(f"config: {exc}") from exc


def open_journal(config: RemediatorConfig) -> Journal:
    try:
        return Journal(config.journal)
    except Exception as exc:  # sqlite3.Error, OSError: name the file
        raise CliError(f"cannot open the journal {config.journal}: {exc}") from exc


def load_cli_inventory(config: RemediatorConfig) -> Inventory:
    try:
        return load_inventory(config.inventory)
    except InventoryError as exc:
        raise CliError(exc.report()) from exc


def who() -> str:
    """`user@host`, recorded with every pause and resume."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def fail(error: CliError) -> int:
    print(f"mlx-medic: {error}", file=sys.stderr)
    return 2
