"""The `mlx-medic` command: one console script, a subcommand per job.

Like pip's `commands_dict`, the table below names each command's module and only the
chosen one is imported: `mlx-medic node ...` runs over SSH on every step and re-check
and `mlx-medic exporter` runs on every node, so neither may pay for aiohttp, asyncssh or
the engine.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandInfo:
    module: str  # has add_arguments(parser) and run(args) -> int
    help: str
    group: str
    json_log_lines: bool = False


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
        json_log_lines=True,
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
}


def _overview() -> str:
    groups: dict[str, list[str]] = {}
    for name, info in COMMANDS.items():
        groups.setdefault(info.group, []).append(f"  {name:<14}{info.help}")
    return "\n".join(f"{group} commands:\n" + "\n".join(lines) for group, lines in groups.items())


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with `command`, that command's arguments too (and only its
    module imported)."""
    parser = argparse.ArgumentParser(
        prog="mlx-medic",
        description=__doc__.splitlines()[0],
        epilog=_overview(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, info in COMMANDS.items():
        subparser = sub.add_parser(name, description=info.help)  # listed in the epilog
        if name == command:
            importlib.import_module(info.module).add_arguments(subparser)
    return parser


def _chosen_command(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def parse_args(argv: list[str]) -> argparse.Namespace:
    command = _chosen_command(argv)
    return build_parser(command if command in COMMANDS else None).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = COMMANDS[args.command]
    from mlx_medic.logs import setup_logging

    setup_logging(json_lines=info.json_log_lines)
    return int(importlib.import_module(info.module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
