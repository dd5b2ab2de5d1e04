"""`mlx-medic render TARGET --config.file INVENTORY --out DIR`: deployment files."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

TARGETS = {  # name -> module under mlx_medic.render; `all` renders each in this order
    "launchd": "launchd",
    "systemd": "systemd",
    "supervisord": "supervisord",
    "sudoers": "sudoers",
    "authorized-keys": "authorized_keys",
    "newsyslog": "newsyslog",
    "prometheus": "prometheus",
    "alertmanager": "alertmanager",
    "rules": "rules",
}

DESCRIPTION = """\
Render deployment files from the inventory into DIR (each target in a folder of its own:
launchd/NODE/..., systemd/NODE/..., sudoers/NODE/mlx-medic, ...; prometheus.yml,
alertmanager.yml and rules/ at the top).

--config.file names the INVENTORY, not the remediator's config: it is the one file that
says what runs where (nodes, users, labels, log files, timeouts), which every rendered
file is made from, and the file the exporter and the serve wrapper read on every node.
What the inventory cannot know is given by flags: where the remediator and Alertmanager
run, and the remediator's and the serve wrappers' public keys.

The inventory does not say which nodes run macOS or Linux: launchd and systemd each
render an exporter job for every node (install the one for the node's system); a model's
own service is rendered by its service.manager's target only."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("target", choices=[*TARGETS, "all"])
    parser.add_argument(
        "--config.file",
        dest="config_file",
        type=Path,
        required=True,
        help="the inventory YAML (mlx-medic check-config FILE)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory to write into (made if missing; files replaced)",
    )
    parser.add_argument(
        "--remediator.url",
        dest="remediator_url",
        default=None,
        help="the remediator as Alertmanager and Prometheus reach it, e.g."
        " https://remediator.example:10901 (prometheus, alertmanager)",
    )
    parser.add_argument(
        "--remediator.command",
        dest="remediator_command",
        default="/opt/mlx-medic/.venv/bin/mlx-medic",
        help="mlx-medic on the remediator's host (default %(default)s)",
    )
    parser.add_argument(
        "--remediator.user",
        dest="remediator_user",
        default="mlx-medic",
        help="the user the remediator runs as (default %(default)s)",
    )
    parser.add_argument(
        "--remediator.config",
        dest="remediator_config",
        default="/etc/mlx-medic/remediator.yml",
        help="the remediator's config on its host (default %(default)s)",
    )
    parser.add_argument(
        "--alertmanager.address",
        dest="alertmanager",
        default=None,
        help="HOST:PORT of Alertmanager for Prometheus (prometheus)",
    )
    parser.add_argument(
        "--alertmanager.credentials-file",
        dest="am_credentials",
        default="/etc/alertmanager/mlx-medic.token",
        help="the webhook token file on Alertmanager's host (default %(default)s)",
    )
    parser.add_argument(
        "--prometheus.credentials-file",
        dest="prom_credentials",
        default="/etc/prometheus/mlx-medic.token",
        help="the token file Prometheus scrapes the remediator with (default %(default)s)",
    )
    parser.add_argument(
        "--ssh.public-key",
        dest="public_key",
        type=Path,
        default=None,
        help="the remediator's public key (authorized-keys); default: the"
        " inventory's ssh.identity_file with .pub added",
    )
    parser.add_argument(
        "--serve.public-key",
        dest="serve_public_key",
        type=Path,
        default=None,
        help="the serve wrappers' public key (authorized-keys), for every model"
        " whose serve.identity_file is set; default: each model's"
        " serve.identity_file with .pub added",
    )
    parser.add_argument(
        "--rules.file",
        dest="rules_file",
        type=Path,
        default=None,
        help="the rule file to render (default: the rules shipped with"
        " mlx-medic, alerting-rules/mlx-medic.rules.yaml in a checkout)",
    )
    parser.add_argument(
        "--rules.for",
        dest="rules_for",
        action="append",
        default=[],
        metavar="ALERT=DURATION",
        help="override an alert's `for:` (repeat)",
    )
    parser.add_argument(
        "--rules.interval",
        dest="rules_interval",
        default=None,
        metavar="DURATION",
        help="every rule group's evaluation interval",
    )
    parser.add_argument(
        "--prometheus.interval",
        dest="prometheus_interval",
        default=None,
        metavar="DURATION",
        help="Prometheus's scrape and evaluation interval (default 15s)",
    )
    parser.add_argument(
        "--alertmanager.group-wait",
        dest="am_group_wait",
        default=None,
        metavar="DURATION",
        help="every route's group_wait (default 10s for"
        " the remediator's routes, 30s for on-call's)",
    )
    parser.add_argument(
        "--alertmanager.group-interval",
        dest="am_group_interval",
        default=None,
        metavar="DURATION",
        help="every route's group_interval"
        " (default 1m for the remediator's routes, 5m for on-call's)",
    )
    parser.add_argument(
        "--alertmanager.oncall-url",
        dest="oncall_url",
        default=None,
        metavar="URL",
        help="on-call's webhook (default a placeholder: your pager)",
    )


def _public_key(args: argparse.Namespace, inventory: Any, needed: bool) -> str | None:
    from mlx_medic.render.authorized_keys import check_public_key
    from mlx_medic.render.files import RenderError

    path = args.public_key
    if path is None and inventory.ssh.identity_file is not None:
        path = Path(f"{inventory.ssh.identity_file}.pub")
    if path is None or not needed:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RenderError(f"--ssh.public-key {path}: cannot read ({exc.strerror or exc})") from None
    return check_public_key(text, str(path))


def _serve_public_keys(args: argparse.Namespace, inventory: Any, needed: bool) -> dict[str, str]:
    """model -> its wrapper's key line, for the models whose wrapper logs in to its peers
    with serve.identity_file; each file read once."""
    from mlx_medic.render.authorized_keys import check_public_key
    from mlx_medic.render.files import RenderError

    if not needed:
        return {}
    models = [m for m in inventory.models if m.serve.identity_file is not None]
    if args.serve_public_key is not None and not models:
        raise RenderError(
            f"--serve.public-key {args.serve_public_key}: no model sets"
            " serve.identity_file (the key its wrapper logs in to peers with)"
        )
    read: dict[Path, str] = {}
    keys = {}
    for model in models:
        path = args.serve_public_key or Path(f"{model.serve.identity_file}.pub")
        if path not in read:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                flag = (
                    "--serve.public-key"
                    if args.serve_public_key
                    else f"models.{model.name}.serve.identity_file's .pub"
                )
                raise RenderError(
                    f"{flag} {path}: cannot read ({exc.strerror or exc}); give"
                    " it with --serve.public-key FILE"
                ) from None
            read[path] = check_public_key(text, str(path))
        keys[model.name] = read[path]
    return keys


def run(args: argparse.Namespace) -> int:
    from mlx_medic.inventory.load import load_inventory
    from mlx_medic.inventory.methods import InventoryError
    from mlx_medic.render import rules
    from mlx_medic.render.files import RenderError, RulesOptions, Site, write

    names = list(TARGETS) if args.target == "all" else [args.target]
    try:
        inventory = load_inventory(args.config_file)
    except InventoryError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    try:
        overrides = {}
        for item in args.rules_for:
            alert, sep, duration = item.partition("=")
            if not sep or not alert:
                raise RenderError(f"--rules.for {item!r}: write ALERT=DURATION")
            overrides[alert] = duration
        site = Site(
            inventory=inventory,
            rules=RulesOptions(args.rules_file or rules.SOURCE, overrides, args.rules_interval),
            remediator_url=args.remediator_url,
            remediator_command=args.remediator_command,
            remediator_user=args.remediator_user,
            remediator_config=args.remediator_config,
            alertmanager=args.alertmanager,
            alertmanager_credentials_file=args.am_credentials,
            prometheus_credentials_file=args.prom_credentials,
            public_key=_public_key(args, inventory, "authorized-keys" in names),
            serve_public_keys=_serve_public_keys(args, inventory, "authorized-keys" in names),
            prometheus_interval=args.prometheus_interval,
            alertmanager_group_wait=args.am_group_wait,
            alertmanager_group_interval=args.am_group_interval,
            **({"oncall_url": args.oncall_url} if args.oncall_url else {}),
        )
        files = []
        for name in names:  # every target rendered before anything is written
            module = importlib.import_module(f"mlx_medic.render.{TARGETS[name]}")
            files += module.render(site)
        write(args.out, files)
    except RenderError as exc:
        print(f"render {args.target}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # each file is replaced whole; those before it are written
        print(f"render {args.target}: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    for item in files:
        print(args.out / item.path)
    return 0
