"""What the on-call commands share: the config and journal the running service uses,
found the way the service finds them (`--config.file`, `$MLX_MEDIC_CONFIG`, the shipped
units' /etc/mlx-medic/remediator.yml), or a refusal when there is no telling; the line
that says which journal a command used; and clear errors.

A command that wrote to some other journal would tell on-call it pressed the button while
the service kept acting, so every doubt ends in a non-zero exit that names the flag.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.schema import Inventory
from mlx_medic.person import user_name, who
from mlx_medic.remediator.cli_identity import (
    become_journal_owner,
    can_write,
    journal_owner,
)
from mlx_medic.remediator.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG_FILE,
    ConfigError,
    ConfigSource,
    RemediatorConfig,
    command_line,
    find_config_file,
    read_config,
)
from mlx_medic.remediator.journal import Journal

NO_CONFIG = (
    "cannot tell which journal the remediator service uses, so nothing was changed:"
    " pass --config.file FILE (the config the service runs with), or set"
    f" {CONFIG_ENV}=FILE; the shipped units' {DEFAULT_CONFIG_FILE} does not exist here"
    " (run this on the remediator's host)"
)


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        default=None,
        help=f"the remediator config the service runs with (default: ${CONFIG_ENV}, else"
        f" {DEFAULT_CONFIG_FILE}, the shipped units' path; neither: refused)",
    )


@dataclass
class OnCall:
    """One on-call command's hold on the service: its config, its journal, who acts."""

    config: RemediatorConfig
    source: ConfigSource
    journal: Journal
    actor: str  # user@host of the person, recorded with what they do

    def command(self, *words: str) -> str:
        """A command line that reaches this same journal, for hints to copy: the bare
        command when the config is at the default path, else with its `--config.file`."""
        return command_line(self.source, *words)

    def load_inventory(self) -> Inventory:
        try:
            return load_inventory(self.config.inventory)
        except InventoryError as exc:
            raise CliError(exc.report()) from exc

    def model_names(self) -> list[str]:
        return [m.name for m in self.load_inventory().models]

    def unknown_model(self, model: str, names: list[str]) -> CliError:
        known = ", ".join(names) or "none"
        return CliError(f"no model {model!r} in {self.config.inventory} (known: {known})")


def service_config(flag: Path | None) -> tuple[ConfigSource, RemediatorConfig]:
    """The config the service uses, or a CliError when there is no telling."""
    source = find_config_file(flag)
    if source is None:
        raise CliError(NO_CONFIG)
    try:
        config = read_config(source)
    except ConfigError as exc:
        raise CliError(f"config: {exc.report()}") from exc
    if "journal" not in config.model_fields_set:
        raise CliError(
            f"{source} does not name the journal; the service's default is under its own"
            " user's home, which this command cannot know, so nothing was changed: add"
            " `journal: /var/lib/mlx-medic-remediator/journal.sqlite` (the service's path) to it"
        )
    if not config.journal.is_absolute():
        raise CliError(
            f"{source}: journal {config.journal} is relative to the service's working"
            " directory, which this command cannot know; name it by its absolute path"
        )
    return source, config


def cannot_write(path: Path, me: str, owner_uid: int) -> str:
    """Why a command cannot write the journal, and who can: its owner, or root (sudo),
    which writes as the owner; said once when the owner is root."""
    owner = user_name(owner_uid)
    who_can = (
        "run this as root (with sudo)"
        if owner_uid == 0
        else f"run this as {owner}, or as root (sudo), which writes as the journal's owner"
    )
    return f"cannot write the journal {path} as {me}: it belongs to {owner}; {who_can}"


def open_oncall(args: argparse.Namespace, *, writes: bool) -> OnCall:
    """The service's config and journal, opened as the journal's owner (see
    cli_identity); says on stderr which journal, from which config, as whom."""
    actor = who()  # before root becomes the journal's owner
    source, config = service_config(getattr(args, "config_file", None))
    path = config.journal
    new = not path.exists()
    if new and not writes:
        raise CliError(
            f"no journal at {path} (named by {source}): the service has not started with"
            " this config yet, or the config is not the service's"
        )
    as_user = become_journal_owner(path)
    if writes and not can_write(path):
        raise CliError(cannot_write(path, user_name(os.geteuid()), journal_owner(path)[0]))
    try:
        journal = Journal(path)
    except (sqlite3.Error, OSError) as exc:
        raise CliError(f"cannot open the journal {path}: {exc}") from exc
    said = f"mlx-medic: journal {path}{' (new)' if new else ''}, named by {source}"
    print(said + (f"; written as {as_user}, its owner" if as_user else ""), file=sys.stderr)
    return OnCall(config, source, journal, actor)


def run_oncall(args: argparse.Namespace, body: Callable[[OnCall], int], *, writes: bool) -> int:
    """Open the service's journal, run `body`, close; a problem is a named error, exit 2."""
    command = getattr(args, "command", "")
    try:
        oncall = open_oncall(args, writes=writes)
    except CliError as exc:
        return fail(exc, command)
    try:
        return body(oncall)
    except CliError as exc:
        return fail(exc, command)
    except sqlite3.Error as exc:
        return fail(CliError(f"journal {oncall.config.journal}: {exc}"), command)
    finally:
        oncall.journal.close()


def fail(error: CliError, command: str = "") -> int:
    """`mlx-medic COMMAND: error` on stderr, exit 2 (docs/exit-codes.md)."""
    print(f"mlx-medic{' ' + command if command else ''}: {error}", file=sys.stderr)
    return EXIT_USAGE
