"""The `mlx-medic` command: one console script, a subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import sys

from mlx_medic.logs import setup_logging

# subcommand -> (module with add_arguments/run, one-line help, JSON log lines?)
SUBCOMMANDS: dict[str, tuple[str, str, bool]] = {
    "exporter": ("exporter.main", "serve this node's Prometheus metrics", False),
    "check-config": ("mlx_medic.check_config", "validate an inventory file", False),
    "probe": ("mlx_medic.probe_cli", "probe a model's server once from this node", False),
    "remediator": ("remediator.service", "run the Alertmanager webhook service", True),
    "remediate": ("remediator.cli_remediate", "run the playbook for a model by hand", False),
    "log": ("remediator.cli_log", "show the remediation journal", False),
    "pause": ("remediator.cli_pause", "stop automatic action (all models or one)", False),
    "resume": ("remediator.cli_resume", "allow automatic action again; closes the circuit", False),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlx-medic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text, _json) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(subparser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, _help, json_lines = SUBCOMMANDS[args.command]
    setup_logging(json_lines=json_lines)
    return int(importlib.import_module(module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
