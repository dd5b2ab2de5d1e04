"""The `mlx-medic` command: one console script, a subcommand per job.

Like pip's `commands_dict`, the table below names each command's module and only the
chosen one is imported: `mlx-medic node ...` runs over SSH on every step and re-check
and `mlx-medic exporter` runs on every node, so neither may pay for aiohttp, asyncssh or
the engine.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

from mlx_medic.command_line import EXIT_FAILED, CommandError, CommandParser


class CommandInfo(NamedTuple):  # not a dataclass: one fewer for every command's start
    module: str  # has add_arguments(parser) and run(args) -> int
    help: str
    group: str


COMMANDS: dict[str, CommandInfo] = {
    # node
    "exporter": CommandInfo(
        "mlx_medic.exporter.main", "serve this node's Prometheus metrics", "node"
    ),
    "probe": CommandInfo(
        "mlx_medic.probe_cli", "probe a model's server once from this node", "node"
    ),
    "node": CommandInfo(
        "mlx_medic.node.cli", "run a node helper (docs/node-helpers.md) on this node", "node"
    ),
    "serve": CommandInfo(
        "mlx_medic.serve.cli", "run a model's ranks on its head (what its service runs)", "node"
    ),
    "check-config": CommandInfo(
        "mlx_medic.check_config", "validate an inventory or the remediator's config", "node"
    ),
    "doctor": CommandInfo(
        "mlx_medic.doctor.cli",
        "check this node against what mlx-medic assumes; a report for an issue",
        "node",
    ),
    # deployment
    "render": CommandInfo(
        "mlx_medic.render.cli",
        "render deployment files (launchd, systemd, sudoers, ...) from the inventory",
        "deployment",
    ),
    # remediator
    "remediator": CommandInfo(
        "mlx_medic.remediator.service",
        "run the Alertmanager webhook service",
        "remediator",
    ),
    # on-call
    "backend": CommandInfo(
        "mlx_medic.backend_cli", "show, pin or unpin a model's backend (on its head)", "on-call"
    ),
    "log": CommandInfo("mlx_medic.remediator.cli_log", "show the remediation journal", "on-call"),
    "remediate": CommandInfo(
        "mlx_medic.remediator.cli_remediate", "run the playbook for a model by hand", "on-call"
    ),
    "pause": CommandInfo(
        "mlx_medic.remediator.cli_pause", "stop automatic action (all models or one)", "on-call"
    ),
    "resume": CommandInfo(
        "mlx_medic.remediator.cli_resume",
        "allow automatic action again; closes the circuit",
        "on-call",
    ),
    "drain": CommandInfo(
        "mlx_medic.remediator.cli_drain",
        "take a node out of service before its reboot: pause, stop, sweep, silence",
        "on-call",
    ),
    "undrain": CommandInfo(
        "mlx_medic.remediator.cli_undrain",
        "after the node's reboot: check its boot id, start and verify its models again",
        "on-call",
    ),
    "journal": CommandInfo(
        "mlx_medic.remediator.cli_journal",
        "prune the remediation journal (`journal prune [--dry-run]`)",
        "on-call",
    ),
}


def _overview() -> str:
    groups: dict[str, list[str]] = {}
    for name, info in COMMANDS.items():
        groups.setdefault(info.group, []).append(f"  {name:<14}{info.help}")
    return "\n".join(f"{group} commands:\n" + "\n".join(lines) for group, lines in groups.items())


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every command; with `command`, only that command's,
    with its arguments (and only its module imported).

    Why only one: a node helper starts over SSH on every step of every run, and building
    two dozen unused subparsers was a fifth of its start-up. Nothing a command parses
    depends on its siblings; an unknown command gets the full list in its error."""
    parser = CommandParser(
        prog="mlx-medic",
        description=__doc__.splitlines()[0],
        epilog=_overview(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, info in COMMANDS.items():
        if command is None:
            sub.add_parser(name, description=info.help)  # listed in the epilog
        elif name == command:
            subparser = sub.add_parser(name, description=info.help)
            importlib.import_module(info.module).add_arguments(subparser)
    return parser


def _chosen_command(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def parse_args(argv: list[str]) -> argparse.Namespace:
    command = _chosen_command(argv)
    parser = build_parser(command if command in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, so the error names its --help
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = commands.choices[name]
    return chosen


def main(argv: list[str] | None = None) -> int:
    """Run one command; a CommandError from its start-up is one line on stderr and its
    exit code (docs/exit-codes.md), never a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    collecting = gc.isenabled()
    if argv[:1] == ["node"]:
        # A node helper lives for one step of a run: the cyclic collector's passes over the
        # objects its imports make are 3 % of its instructions, and free nothing it keeps.
        gc.disable()
    try:
        args = parse_args(argv)
        return run_command(args, importlib.import_module(COMMANDS[args.command].module).run)
    finally:
        if collecting:
            gc.enable()


def run_command(args: argparse.Namespace, run: Callable[[argparse.Namespace], int | None]) -> int:
    """`run(args)` with its logging set up as its flags say; a CommandError is one line.

    A node helper's logging is set up when it first logs (mlx_medic.log_on_use)."""
    settings = (
        getattr(args, "log_format", "text"),
        getattr(args, "log_file", None),
        getattr(args, "log_level", "info"),
    )
    try:
        if args.command == "node":
            from mlx_medic.log_on_use import set_up_on_first_use

            set_up_on_first_use(*settings)
        else:
            from mlx_medic.logs import setup_logging

            setup_logging(*settings)
        return int(run(args) or 0)
    except CommandError as exc:
        print(f"mlx-medic {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so exit's flush is quiet
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
